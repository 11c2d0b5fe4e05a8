//! The pipeline itself: one function computes what every generated place should say, then either
//! reports the differences (check) or returns the updated markdown, figures and pages (build).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::Range;

use crate::document::{self, Document, Region, first_line};
use crate::error::{ContentError, ContentErrors, Problem};
use crate::eval::{Computed, Evaluator};
use crate::examples::{self, Decl, DeclKind};
use crate::figures::{self, FigureKind, Prepared};
use crate::generate::{self, DEFAULT_DIGITS};
use crate::location::LineIndex;
use crate::values::Node;
use crate::{html, notebook};

/// One lesson file, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// The path shown in messages (e.g. `content/01-attention.md`); its file stem, less any
    /// leading `NN-`, is the section id.
    pub path: String,
    /// The markdown.
    pub text: String,
}

/// Everything the pipeline reads: the lesson files in order, and which figure files exist.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// Lesson sections, in reading order.
    pub markdown: Vec<SourceFile>,
    /// Figure files present next to the lesson, as `figures/NAME.svg` / `figures/NAME.png`.
    pub figures: BTreeSet<String>,
}

/// A generated place whose committed text differs from what the build computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    /// File, as in [`SourceFile::path`].
    pub file: String,
    /// 1-based line of the place.
    pub line: usize,
    /// What the place is (`citation sentence.love.output`, `steps sentence.love`, ...).
    pub what: String,
    /// What the build would write (for blocks: the first line that differs).
    pub expected: String,
    /// What is there now.
    pub found: String,
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: expected {}, found {} ({})",
            self.file, self.line, self.expected, self.found, self.what
        )
    }
}

/// A rendered figure file (`figures/NAME.svg` or `.png`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FigureFile {
    /// Path relative to the content folder and to the site.
    pub name: String,
    /// The file's bytes.
    pub bytes: Vec<u8>,
}

/// A text file of the site (page, stylesheet, notebook, markdown copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFile {
    /// Path relative to the site folder.
    pub name: String,
    /// Its text.
    pub text: String,
}

/// The result of a build.
#[derive(Debug, Clone)]
pub struct Build {
    /// The lesson files with every generated place up to date (same order as the input).
    pub markdown: Vec<SourceFile>,
    /// The places that were out of date (what `--check` reports).
    pub stale: Vec<Stale>,
    /// Figures re-rendered because their inputs changed or their files are missing.
    pub figures: Vec<FigureFile>,
    /// Figure files no figure block declares any more (`figures/NAME.svg`), to delete.
    pub orphans: Vec<String>,
    /// Every text file of the site: pages, stylesheet, notebooks, markdown copies.
    pub site: Vec<OutputFile>,
}

impl Build {
    /// Whether the committed lesson is up to date.
    pub fn is_fresh(&self) -> bool {
        self.stale.is_empty()
    }
}

/// The report for `--check`: every stale place and how to fix it; empty when fresh.
pub fn stale_report(stale: &[Stale]) -> String {
    if stale.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    for s in stale {
        out.push_str(&s.to_string());
        out.push('\n');
    }
    out.push_str(&format!(
        "{} generated place{} out of date: run `cargo xtask build-content` to rewrite them, then review and commit the diff",
        stale.len(),
        if stale.len() == 1 { " is" } else { "s are" }
    ));
    out
}

impl Stale {
    /// The `--check` report for a list of stale places (see [`stale_report`]).
    pub fn report(stale: &[Stale]) -> String {
        stale_report(stale)
    }
}

/// The section id of a lesson file: its stem without a leading `NN-` (`01-attention.md` → `attention`).
pub fn section_id(path: &str) -> String {
    let name = path.rsplit(['/', '\\']).next().unwrap_or(path);
    let stem = name.strip_suffix(".md").unwrap_or(name);
    let trimmed = stem.trim_start_matches(|c: char| c.is_ascii_digit());
    match trimmed.strip_prefix('-') {
        Some(rest) if trimmed.len() < stem.len() => rest.to_string(),
        _ => stem.to_string(),
    }
}

/// A replacement of one byte range of one file.
struct Edit {
    range: Range<usize>,
    text: String,
    what: String,
}

/// A figure to (maybe) render.
struct FigureJob {
    id: String,
    /// Where the figure's region is, for errors while drawing.
    doc: usize,
    at: usize,
    prepared: Prepared,
}

/// What one pass over the lesson computed.
struct Plan {
    docs: Vec<Document>,
    edits: Vec<Vec<Edit>>,
    figures: Vec<FigureJob>,
    figure_info: HashMap<String, html::FigureInfo>,
    notebooks: Vec<OutputFile>,
    records: Vec<(String, Node)>,
}

/// Checks the lesson: the stale places, or the content errors. Renders nothing.
pub fn check(sources: &Sources) -> Result<Vec<Stale>, ContentErrors> {
    let plan = plan(sources)?;
    Ok(stale_places(sources, &plan))
}

/// Builds the lesson: updated markdown, re-rendered figures (only stale ones) and the site.
pub fn build(sources: &Sources) -> Result<Build, ContentErrors> {
    let plan = plan(sources)?;
    let stale = stale_places(sources, &plan);
    let markdown: Vec<SourceFile> = sources
        .markdown
        .iter()
        .zip(&plan.edits)
        .map(|(file, edits)| SourceFile { path: file.path.clone(), text: apply(&file.text, edits) })
        .collect();
    let mut figures = Vec::new();
    let mut problems = Vec::new();
    for job in &plan.figures {
        if !figure_is_current(sources, &plan, job) {
            match figures::render(&job.prepared) {
                Ok(f) => {
                    figures.push(FigureFile {
                        name: format!("figures/{}.svg", job.id),
                        bytes: f.svg.into_bytes(),
                    });
                    figures.push(FigureFile { name: format!("figures/{}.png", job.id), bytes: f.png });
                }
                Err(e) => problems.push(Problem::new(
                    job.doc,
                    job.at,
                    format!("figure `{}` could not be drawn: {e}", job.id),
                    format!("<!-- qkv figure {} -->", job.id),
                    "data the figure renderer accepts",
                )),
            }
        }
    }
    if !problems.is_empty() {
        return Err(locate(sources, problems));
    }
    let site = html::site(&markdown, &plan.figure_info, plan.notebooks.clone());
    let orphans = orphan_figures(sources, &plan);
    Ok(Build { markdown, stale, figures, orphans, site })
}

/// Every declaration's full computed record as `(qualified id, listing)`, in reading order: one
/// line per value, `path = value`, numbers at full precision. What the snapshot tests hold.
pub fn records(sources: &Sources) -> Result<Vec<(String, String)>, ContentErrors> {
    let plan = plan(sources)?;
    Ok(plan
        .records
        .iter()
        .map(|(key, node)| {
            let mut out = String::new();
            node.dump(key, &mut out);
            (key.clone(), out)
        })
        .collect())
}

/// Whether a figure's committed region carries its current hash and both files exist.
fn figure_is_current(sources: &Sources, plan: &Plan, job: &FigureJob) -> bool {
    let files = [format!("figures/{}.svg", job.id), format!("figures/{}.png", job.id)];
    let present = files.iter().all(|f| sources.figures.contains(f));
    let marker = format!("qkv-figure-hash {}", job.prepared.hash);
    present
        && sources.markdown.iter().zip(&plan.docs).any(|(file, doc)| {
            doc.regions.iter().any(|r| {
                r.directive.first().map(String::as_str) == Some("figure")
                    && r.directive.get(1) == Some(&job.id)
                    && file.text[r.body.clone()].contains(&marker)
            })
        })
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut out = text.to_string();
    let mut sorted: Vec<&Edit> = edits.iter().collect();
    sorted.sort_by_key(|e| std::cmp::Reverse(e.range.start));
    for e in sorted {
        out.replace_range(e.range.clone(), &e.text);
    }
    out
}

/// Figure files that no figure region produces.
fn orphan_figures(sources: &Sources, plan: &Plan) -> Vec<String> {
    let wanted: BTreeSet<String> = plan
        .figures
        .iter()
        .flat_map(|j| [format!("figures/{}.svg", j.id), format!("figures/{}.png", j.id)])
        .collect();
    sources.figures.iter().filter(|f| !wanted.contains(*f)).cloned().collect()
}

fn stale_places(sources: &Sources, plan: &Plan) -> Vec<Stale> {
    let mut stale = Vec::new();
    for (file, edits) in sources.markdown.iter().zip(&plan.edits) {
        let index = LineIndex::new(&file.text);
        for e in edits {
            let found = &file.text[e.range.clone()];
            if found == e.text {
                continue;
            }
            let (mut line, _) = index.position(&file.text, e.range.start);
            let (expected, found) = if e.text.contains('\n') || found.contains('\n') {
                // Blocks: point at the first line that differs.
                let (new, old): (Vec<&str>, Vec<&str>) = (e.text.lines().collect(), found.lines().collect());
                let i = (0..new.len().max(old.len())).find(|&i| new.get(i) != old.get(i)).unwrap_or(0);
                line += i;
                match (new.get(i), old.get(i)) {
                    (Some(n), Some(o)) => {
                        let (n, o) = differing_window(n, o);
                        (format!("`{n}`"), format!("`{o}`"))
                    }
                    (n, o) => {
                        let quote = |s: Option<&&str>| {
                            s.map_or("(nothing)".to_string(), |s| format!("`{}`", shorten(s)))
                        };
                        (quote(n), quote(o))
                    }
                }
            } else {
                (e.text.clone(), if found.is_empty() { "(nothing)".to_string() } else { found.to_string() })
            };
            stale.push(Stale { file: file.path.clone(), line, what: e.what.clone(), expected, found });
        }
        // Citations and regions were gathered separately; list each file top to bottom.
        let first = stale.iter().position(|s| s.file == file.path).unwrap_or(stale.len());
        stale[first..].sort_by_key(|s| s.line);
    }
    // Figures sit beside the lesson files, so name them the same way.
    let folder =
        sources.markdown.first().and_then(|f| f.path.rsplit_once(['/', '\\'])).map_or("", |(d, _)| d);
    let shown = |name: &str| if folder.is_empty() { name.to_string() } else { format!("{folder}/{name}") };
    for orphan in orphan_figures(sources, plan) {
        stale.push(Stale {
            file: shown(&orphan),
            line: 1,
            what: "figure file no figure block declares".into(),
            expected: "no file".into(),
            found: "a leftover figure".into(),
        });
    }
    for job in &plan.figures {
        for ext in ["svg", "png"] {
            let name = format!("figures/{}.{ext}", job.id);
            if !sources.figures.contains(&name) {
                stale.push(Stale {
                    file: shown(&name),
                    line: 1,
                    what: format!("figure {}", job.id),
                    expected: "the rendered figure".into(),
                    found: "no file".into(),
                });
            }
        }
    }
    stale
}

/// The part of two lines around where they first differ, so a long line's change stays visible:
/// `…the output is 4.01.](figures/love-sweep.svg)` against `…the output is 4.41.](…`.
fn differing_window(new: &str, old: &str) -> (String, String) {
    let (new, old) = (new.trim(), old.trim());
    let (n, o): (Vec<char>, Vec<char>) = (new.chars().collect(), old.chars().collect());
    let first = n.iter().zip(&o).take_while(|(a, b)| a == b).count();
    let start = first.saturating_sub(30);
    let cut = |chars: &[char]| {
        let end = (start + 70).min(chars.len());
        let mut out = String::new();
        if start > 0 {
            out.push('…');
        }
        out.extend(&chars[start..end]);
        if end < chars.len() {
            out.push('…');
        }
        out
    };
    (cut(&n), cut(&o))
}

fn shorten(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() > 90 {
        format!("{}…", s.chars().take(90).collect::<String>())
    } else {
        s.to_string()
    }
}

/// Turns problems into located errors.
///
/// Problems with an empty `expected` are consequences of another reported problem (a reference to
/// a broken block) and are left out.
fn locate(sources: &Sources, problems: Vec<Problem>) -> ContentErrors {
    // Should every problem be a consequence (which would be a bug), show them rather than nothing.
    let all_quiet = problems.iter().all(|p| p.expected.is_empty());
    let mut errors: Vec<ContentError> = problems
        .into_iter()
        .filter(|p| all_quiet || !p.expected.is_empty())
        .map(|p| {
            let file = &sources.markdown[p.doc];
            let index = LineIndex::new(&file.text);
            let (line, column) = index.position(&file.text, p.at);
            let found = if p.found.is_empty() {
                file.text.lines().nth(line - 1).unwrap_or("").trim().to_string()
            } else {
                p.found
            };
            ContentError {
                file: file.path.clone(),
                line,
                column,
                message: p.message,
                found,
                expected: p.expected,
            }
        })
        .collect();
    errors.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
    errors.dedup();
    ContentErrors(errors)
}

fn plan(sources: &Sources) -> Result<Plan, ContentErrors> {
    let mut problems = Vec::new();
    let sections: Vec<String> = sources.markdown.iter().map(|f| section_id(&f.path)).collect();
    let mut docs = Vec::new();
    for (i, file) in sources.markdown.iter().enumerate() {
        match document::parse(i, &file.text) {
            Ok(d) => docs.push(d),
            Err(p) => {
                problems.extend(p);
                docs.push(Document {
                    blocks: Vec::new(),
                    citations: Vec::new(),
                    regions: Vec::new(),
                    title: None,
                });
            }
        }
    }
    let mut decls: Vec<Decl> = Vec::new();
    let mut broken = std::collections::HashSet::new();
    for (i, doc) in docs.iter().enumerate() {
        for block in &doc.blocks {
            match examples::parse(i, block) {
                Ok(d) => {
                    if let Some(prev) = decls.iter().find(|p| p.doc == i && p.id == d.id) {
                        let line = LineIndex::new(&sources.markdown[i].text)
                            .position(&sources.markdown[i].text, prev.start)
                            .0;
                        problems.push(Problem::new(
                            i,
                            d.id_at,
                            format!("duplicate id `{}` (first declared on line {line})", d.id),
                            format!("id = \"{}\"", d.id),
                            "an id not used by another block of this section",
                        ));
                    } else {
                        decls.push(d);
                    }
                }
                Err(p) => {
                    problems.extend(p);
                    if let Some(id) = declared_id(&block.content) {
                        broken.insert(format!("{}.{id}", sections[i]));
                    }
                }
            }
        }
    }
    let by_key: HashMap<String, &Decl> =
        decls.iter().map(|d| (format!("{}.{}", sections[d.doc], d.id), d)).collect();
    let mut eval = Evaluator::new(&sections, by_key.clone());
    eval.broken = broken;
    let mut keys: Vec<(&String, &&Decl)> = by_key.iter().collect();
    keys.sort_by_key(|(_, d)| (d.doc, d.start));
    let mut records = Vec::new();
    for (key, decl) in &keys {
        if !matches!(decl.kind, DeclKind::Figure(_))
            && let Some(r) = eval.record(key)
        {
            records.push(((*key).clone(), r.node));
        }
    }

    let mut edits: Vec<Vec<Edit>> = (0..docs.len()).map(|_| Vec::new()).collect();
    // Citations.
    for (i, doc) in docs.iter().enumerate() {
        for c in &doc.citations {
            let found = &sources.markdown[i].text[c.text.clone()];
            match eval.resolve(i, &c.path) {
                Ok(node) => match node.as_number() {
                    Some(x) if x.is_finite() => edits[i].push(Edit {
                        range: c.text.clone(),
                        text: c.format.apply(x),
                        what: format!("citation {}", c.path),
                    }),
                    Some(x) => problems.push(Problem::new(
                        i,
                        c.path_at,
                        format!("`{}` is {x}, which cannot be shown as a number", c.path),
                        found,
                        "a finite value (a masked score is -inf; cite its weight instead)",
                    )),
                    None => problems.push(Problem::new(
                        i,
                        c.path_at,
                        format!("`{}` is not a single number", c.path),
                        c.path.clone(),
                        format!(
                            "a path down to one number, such as `{}.{}`",
                            c.path,
                            node.children().first().map_or("1", String::as_str)
                        ),
                    )),
                },
                Err(expected) => problems.push(Problem::new(
                    i,
                    c.path_at,
                    format!("unknown reference `{}`", c.path),
                    c.path.clone(),
                    expected,
                )),
            }
        }
    }
    // Generated regions.
    let mut figures_out = Vec::new();
    let mut figure_info = HashMap::new();
    let mut notebooks = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        for region in &doc.regions {
            match generate_region(&mut eval, &decls, &sections, i, region, &sources.markdown[i].text) {
                Ok(Generated { body, what, figure, notebook }) => {
                    edits[i].push(Edit { range: region.body.clone(), text: format!("\n{body}\n"), what });
                    if let Some((job, info)) = figure {
                        figure_info.insert(job.id.clone(), info);
                        figures_out.push(job);
                    }
                    notebooks.extend(notebook);
                }
                Err(p) => problems.push(p),
            }
        }
    }
    problems.append(&mut eval.problems);
    if !problems.is_empty() {
        return Err(locate(sources, problems));
    }
    Ok(Plan { docs, edits, figures: figures_out, figure_info, notebooks, records })
}

struct Generated {
    body: String,
    what: String,
    figure: Option<(FigureJob, html::FigureInfo)>,
    notebook: Option<OutputFile>,
}

/// Options of a directive: positional words and `name=value` pairs.
struct Directive<'r> {
    kind: &'r str,
    args: Vec<&'r str>,
    digits: usize,
}

fn generate_region(
    eval: &mut Evaluator<'_>,
    decls: &[Decl],
    sections: &[String],
    doc: usize,
    region: &Region,
    text: &str,
) -> Result<Generated, Problem> {
    let marker = first_line(&text[region.start..]);
    let bad = |message: String, expected: &str| {
        Problem::new(doc, region.start, message, marker.clone(), expected.to_string())
    };
    let mut directive = Directive {
        kind: region.directive.first().map_or("", String::as_str),
        args: Vec::new(),
        digits: DEFAULT_DIGITS,
    };
    for word in region.directive.iter().skip(1) {
        match word.split_once('=') {
            Some(("digits", d)) => {
                directive.digits = d
                    .parse()
                    .ok()
                    .filter(|&d| d <= 12)
                    .ok_or_else(|| bad(format!("bad `digits={d}`"), "`digits=N` with N from 0 to 12"))?;
            }
            Some((name, _)) => return Err(bad(format!("unknown option `{name}`"), "`digits=N`")),
            None => directive.args.push(word),
        }
    }
    const KINDS: &str = "`steps TARGET`, `table EXAMPLE inputs|weights|scores`, `error EXAMPLE`, `lab EXAMPLE.TOKEN`, `figure ID`";
    let target_arg = directive
        .args
        .first()
        .copied()
        .ok_or_else(|| bad("generated region without a target".into(), KINDS))?;
    let resolve = |eval: &mut Evaluator<'_>| -> Result<(Computed, Vec<String>, String), Problem> {
        let t = eval
            .target(doc, target_arg)
            .map_err(|expected| bad(format!("unknown reference `{target_arg}`"), &expected))?;
        let record =
            eval.record(&t.key).ok_or_else(|| bad(format!("`{target_arg}` has errors (see above)"), ""))?;
        Ok((record.computed, t.rest.iter().map(|s| s.to_string()).collect(), t.key))
    };
    let query_index = |inputs: &crate::eval::AttentionInputs, rest: &[String]| -> Result<usize, Problem> {
        let labels = inputs.query_labels();
        let [token] = rest else {
            return Err(bad(
                format!("`{target_arg}` needs one query token after the example"),
                &format!("`{target_arg}.TOKEN` with TOKEN one of {}", labels.join(", ")),
            ));
        };
        labels
            .iter()
            .position(|l| l == token)
            .or_else(|| {
                token.parse::<usize>().ok().and_then(|p| p.checked_sub(1)).filter(|&p| p < labels.len())
            })
            .ok_or_else(|| {
                bad(
                    format!(
                        "`{token}` is not a query of `{}`",
                        target_arg.rsplit_once('.').map_or(target_arg, |(e, _)| e)
                    ),
                    &format!("one of {}", labels.join(", ")),
                )
            })
    };
    let what = format!("{} {}", directive.kind, directive.args.join(" "));
    let plain = |body: String| Ok(Generated { body, what: what.clone(), figure: None, notebook: None });
    match directive.kind {
        "steps" => {
            let (computed, rest, _) = resolve(eval)?;
            match computed {
                Computed::Attention { inputs, result: Ok(result) } => {
                    let i = query_index(&inputs, &rest)?;
                    plain(generate::attention_steps(
                        &inputs,
                        &result.traces[i],
                        &inputs.query_labels()[i],
                        directive.digits,
                    ))
                }
                Computed::Attention { result: Err(_), .. } => {
                    Err(bad("an example that fails has no steps".into(), "`error EXAMPLE` to show its error"))
                }
                _ if !rest.is_empty() => Err(bad(
                    format!("`{target_arg}` names a value, not a computation"),
                    "the id of a `qkv softmax`, `dot` or `weighted-sum` block",
                )),
                Computed::Softmax(trace) => plain(generate::softmax_steps(&trace, directive.digits)),
                Computed::Dot { q, k, trace } => plain(generate::dot_steps(&q, &k, &trace, directive.digits)),
                Computed::WeightedSum { weights, values, terms, output } => {
                    plain(generate::weighted_sum_steps(&weights, &values, &terms, output, directive.digits))
                }
            }
        }
        "table" => {
            let (computed, rest, _) = resolve(eval)?;
            let field = directive.args.get(1).copied().unwrap_or("weights");
            match (computed, rest.is_empty()) {
                (Computed::Attention { inputs, .. }, true) if field == "inputs" => {
                    plain(generate::inputs_table(&inputs))
                }
                (Computed::Attention { inputs, result: Ok(result) }, true) => match field {
                    "weights" => plain(generate::matrix_table(
                        &inputs,
                        &result,
                        &result.weights,
                        "weights",
                        directive.digits,
                    )),
                    "scores" => plain(generate::matrix_table(
                        &inputs,
                        &result,
                        &result.scores,
                        "scores",
                        directive.digits,
                    )),
                    other => Err(bad(format!("unknown table `{other}`"), "`inputs`, `weights` or `scores`")),
                },
                _ => Err(bad(
                    format!("`{target_arg}` is not an attention example that computes"),
                    "the id of a `qkv attention` block",
                )),
            }
        }
        "error" => {
            let (computed, _, _) = resolve(eval)?;
            match computed {
                Computed::Attention { result: Err(message), .. } => plain(generate::error_block(&message)),
                _ => Err(bad(
                    format!("`{target_arg}` has no error to show"),
                    "an attention example with `expect_error = true`",
                )),
            }
        }
        "lab" => {
            let (computed, rest, key) = resolve(eval)?;
            match computed {
                Computed::Attention { inputs, result: Ok(result) } => {
                    let i = query_index(&inputs, &rest)?;
                    let lab = generate::lab(&inputs, &result, i, directive.digits);
                    let name = format!(
                        "notebooks/{}-{}.ipynb",
                        key.replace('.', "-"),
                        slug(&inputs.query_labels()[i])
                    );
                    let title = format!("Attention for the query “{}”, in NumPy", inputs.query_labels()[i]);
                    let intro = "Scaled dot-product attention in a few lines of NumPy: score every key, softmax, blend the values. The numbers come from the lesson's example; run the cell and compare the printout with the lesson.";
                    let nb = notebook::notebook(&title, intro, &lab);
                    Ok(Generated {
                        body: generate::lab_markdown(&lab, &name),
                        what: what.clone(),
                        figure: None,
                        notebook: Some(OutputFile { name, text: nb }),
                    })
                }
                _ => Err(bad(
                    format!("`{target_arg}` is not an attention example that computes"),
                    "`EXAMPLE.TOKEN` of a `qkv attention` block",
                )),
            }
        }
        "figure" => {
            let id = target_arg;
            let (decl, fig) = decls
                .iter()
                .find_map(|d| match &d.kind {
                    DeclKind::Figure(fig) if d.doc == doc && d.id == id => Some((d, fig)),
                    _ => None,
                })
                .ok_or_else(|| {
                    if eval.broken.contains(&format!("{}.{id}", sections[doc])) {
                        return bad(String::new(), "");
                    }
                    let known: Vec<&str> = decls
                        .iter()
                        .filter(|d| d.doc == doc && matches!(d.kind, DeclKind::Figure(_)))
                        .map(|d| d.id.as_str())
                        .collect();
                    bad(
                        format!("unknown figure `{id}`"),
                        &format!("the id of a `qkv figure` block in this file: {}", known.join(", ")),
                    )
                })?;
            let figure_problem = |at: usize, message: String, found: String, expected: String| {
                Problem::new(doc, at, message, found, expected)
            };
            let prepared = if fig.kind.needs_example() {
                let example = fig.example.as_ref().ok_or_else(|| {
                    figure_problem(
                        decl.start,
                        format!("figure `{id}` has no `example`"),
                        format!("id = \"{id}\""),
                        "`example = \"ID\"` naming an attention example".into(),
                    )
                })?;
                let t = eval.target(doc, &example.value).map_err(|e| {
                    figure_problem(
                        example.at,
                        format!("unknown reference `{}`", example.value),
                        example.value.clone(),
                        e,
                    )
                })?;
                // A broken example reports its own error; the figure stays quiet.
                let record = eval
                    .record(&t.key)
                    .ok_or_else(|| figure_problem(example.at, String::new(), String::new(), String::new()))?;
                let Computed::Attention { inputs, result: Ok(result) } = record.computed else {
                    return Err(figure_problem(
                        example.at,
                        format!("`{}` is not an attention example that computes", example.value),
                        example.value.clone(),
                        "the id of a `qkv attention` block".into(),
                    ));
                };
                let labels = inputs.query_labels();
                let query = match &fig.query {
                    Some(q) => Some(labels.iter().position(|l| *l == q.value).ok_or_else(|| {
                        figure_problem(
                            q.at,
                            format!("`{}` is not a query of `{}`", q.value, example.value),
                            q.value.clone(),
                            format!("one of {}", labels.join(", ")),
                        )
                    })?),
                    None if fig.kind.needs_query() => {
                        return Err(figure_problem(
                            decl.start,
                            format!("a `{}` figure needs `query`", FigureKind::NAMES[fig.kind as usize]),
                            format!("id = \"{id}\""),
                            format!("`query = \"TOKEN\"`, one of {}", labels.join(", ")),
                        ));
                    }
                    None => None,
                };
                figures::prepare_example(fig, &inputs, &result, query).map_err(|e| {
                    figure_problem(
                        decl.start,
                        format!("figure `{id}` cannot be drawn from `{}`", example.value),
                        format!("id = \"{id}\""),
                        e,
                    )
                })?
            } else {
                figures::prepare_scaling(fig)
            };
            let body = format!(
                "![{}](figures/{id}.svg)\n\n*{}* ([PNG](figures/{id}.png))\n\n<!-- qkv-figure-hash {} -->\n",
                escape_alt(&prepared.alt),
                fig.caption.trim(),
                prepared.hash
            );
            let info =
                html::FigureInfo { alt: prepared.alt.clone(), caption: fig.caption.trim().to_string() };
            Ok(Generated {
                body,
                what: format!("figure {id}"),
                figure: Some((FigureJob { id: id.to_string(), doc, at: region.start, prepared }, info)),
                notebook: None,
            })
        }
        other => Err(bad(format!("unknown generated region `{other}`"), KINDS)),
    }
}

/// The `id = "..."` of a block that failed to parse, found line by line.
fn declared_id(content: &str) -> Option<String> {
    content.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("id")?.trim_start().strip_prefix('=')?.trim();
        Some(rest.trim_matches('"').to_string())
    })
}

fn escape_alt(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if matches!(c, '[' | ']' | '\\' | '*' | '_' | '`') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A file-name-safe form of a label.
pub(crate) fn slug(s: &str) -> String {
    let mut out: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').to_string()
}

#[cfg(test)]
mod tests;
