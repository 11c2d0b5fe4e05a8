//! The pipeline itself: one function computes what every generated place should say, then either
//! reports the differences (check) or returns the updated markdown, figures and pages (build).

use std::collections::{BTreeSet, HashMap};

use crate::document::{self, Document};
use crate::encoding::{LineEnding, restore_bom, strip_bom};
use crate::error::{ContentError, ContentErrors, Problem};
use crate::eval::Evaluator;
use crate::examples::{self, Decl, DeclKind, PageDecl};
use crate::figures::{self, FigureJob};
use crate::files::{self, FigureFile, OutputFile, SourceFile, Sources, file_name, linked_file, section_id};
use crate::location::LineIndex;
use crate::stale::{self, Edit, Stale};
use crate::values::Node;
use crate::{citation, html, region};

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

/// What one pass over the lesson computed.
struct Plan {
    docs: Vec<Document>,
    edits: Vec<Vec<Edit>>,
    figures: Vec<FigureJob>,
    /// The page's HTML of each region that has its own (per document, in reading order).
    region_html: Vec<Vec<Option<String>>>,
    notebooks: Vec<OutputFile>,
    records: Vec<(String, Node)>,
    /// Per document, what the site needs beyond its text (summary, graded checks).
    sections: Vec<html::SectionInfo>,
}

/// Checks the lesson: the stale places, or the content errors. Renders nothing.
pub fn check(sources: &Sources) -> Result<Vec<Stale>, ContentErrors> {
    let (sources, _) = without_boms(sources);
    let plan = plan(&sources)?;
    Ok(stale_places(&sources, &plan))
}

/// The sources as the pipeline reads them: byte-order marks set aside (before `# Title` one would
/// turn the heading into a paragraph), and which files had one, to put it back on output.
fn without_boms(sources: &Sources) -> (Sources, Vec<bool>) {
    let (markdown, boms) = sources
        .markdown
        .iter()
        .map(|f| {
            let (text, bom) = strip_bom(&f.text);
            (SourceFile { path: f.path.clone(), text: text.to_string() }, bom)
        })
        .unzip();
    (Sources { markdown, ..sources.clone() }, boms)
}

/// Builds the lesson: updated markdown, re-rendered figures (only stale ones) and the site.
pub fn build(sources: &Sources) -> Result<Build, ContentErrors> {
    let (sources, boms) = without_boms(sources);
    let sources = &sources;
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
                        bytes: files::marked_drawn_from(f.svg, &job.prepared.hash).into_bytes(),
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
    let site = html::site(&markdown, &plan.region_html, &plan.sections, plan.notebooks.clone());
    let orphans = orphan_figures(sources, &plan);
    let markdown = markdown
        .into_iter()
        .zip(boms)
        .map(|(file, bom)| SourceFile { text: restore_bom(file.text, bom), ..file })
        .collect();
    Ok(Build { markdown, stale, figures, orphans, site })
}

/// Every declaration's full computed record as `(qualified id, listing)`, in reading order: one
/// line per value, `path = value`, numbers at full precision. What the snapshot tests hold.
pub fn records(sources: &Sources) -> Result<Vec<(String, String)>, ContentErrors> {
    let plan = plan(&without_boms(sources).0)?;
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

/// Whether a figure's committed region and its SVG file carry its current hash and both files
/// exist.
fn figure_is_current(sources: &Sources, plan: &Plan, job: &FigureJob) -> bool {
    let svg = format!("figures/{}.svg", job.id);
    let files = [format!("figures/{}.png", job.id), svg.clone()];
    let present = files.iter().all(|f| sources.figures.contains(f));
    let drawn = drawn_from_inputs(sources, job).is_ok();
    let marker = format!("{}{}", files::DRAWN_FROM, job.prepared.hash);
    present
        && drawn
        && sources.markdown.iter().zip(&plan.docs).any(|(file, doc)| {
            doc.regions.iter().any(|r| {
                r.directive.first().map(String::as_str) == Some("figure")
                    && r.directive.get(1) == Some(&job.id)
                    && file.text[r.body.clone()].contains(&marker)
            })
        })
}

/// Whether a figure's SVG says it was drawn from the lesson's inputs; if not, what it says instead
/// (`None`: nothing, or no file).
fn drawn_from_inputs<'s>(sources: &'s Sources, job: &FigureJob) -> Result<(), Option<&'s String>> {
    match sources.figure_hashes.get(&format!("figures/{}.svg", job.id)) {
        Some(hash) if *hash == job.prepared.hash => Ok(()),
        other => Err(other),
    }
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
        stale.extend(stale::in_file(&file.path, &file.text, edits));
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
        // A file drawn from other inputs (the lesson went back to an earlier one since), or
        // from inputs it does not say.
        let svg = format!("figures/{}.svg", job.id);
        if let (true, Err(drawn)) = (sources.figures.contains(&svg), drawn_from_inputs(sources, job)) {
            stale.push(Stale {
                file: shown(&svg),
                line: 1,
                what: format!("figure {}", job.id),
                expected: format!("the figure drawn from the lesson's inputs ({})", job.prepared.hash),
                found: drawn.map_or("a file that does not say what it was drawn from".into(), |hash| {
                    format!("a figure drawn from other inputs ({hash})")
                }),
            });
        }
    }
    stale
}

/// The most characters of offending text an error quotes.
const MAX_FOUND: usize = 120;

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
            // A 65-row matrix on one line stays readable in a terminal.
            let found = match found.char_indices().nth(MAX_FOUND) {
                Some((cut, _)) => format!("{}…", &found[..cut]),
                None => found,
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

/// The glossary entries section `doc` declares, in the order of its blocks.
fn terms_of(decls: &[Decl], doc: usize) -> Vec<html::glossary::Term> {
    decls
        .iter()
        .filter(|d| d.doc == doc)
        .filter_map(|d| match &d.kind {
            DeclKind::Page(p) => match p.as_ref() {
                PageDecl::Term(t) => {
                    Some(html::glossary::Term { id: d.id.clone(), entry: t.as_ref().clone() })
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// The glossary is one page for the whole course: a term's id (its anchor) and its text are
/// declared once, and the section that declares a term uses it in its prose, where the glossary's
/// "introduced in" link lands.
fn term_problems(sources: &Sources, decls: &[Decl]) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut seen: Vec<(&Decl, html::glossary::Term)> = Vec::new();
    for d in decls {
        let Some(term) = terms_of(std::slice::from_ref(d), d.doc).pop() else { continue };
        let line = |other: &Decl| {
            let text = &sources.markdown[other.doc].text;
            format!(
                "{}:{}",
                sources.markdown[other.doc].path,
                LineIndex::new(text).position(text, other.start).0
            )
        };
        if let Some((first, _)) = seen
            .iter()
            .find(|(o, t)| o.id == d.id || t.entry.term.to_lowercase() == term.entry.term.to_lowercase())
        {
            problems.push(Problem::new(
                d.doc,
                d.id_at,
                format!(
                    "the glossary already has term `{}` (id `{}`, {})",
                    term.entry.term,
                    first.id,
                    line(first)
                ),
                format!("id = \"{}\"", d.id),
                "one `qkv term` block per term in the whole course, in the section that introduces it",
            ));
            continue;
        }
        if html::glossary::first_uses(&sources.markdown[d.doc].text, std::slice::from_ref(&term))[0].is_none()
        {
            problems.push(Problem::new(
                d.doc,
                d.id_at,
                format!(
                    "term `{}` is not used in the prose of this section, so no first use would link to it",
                    term.entry.term
                ),
                format!("id = \"{}\"", d.id),
                format!(
                    "a use of {} in this section's prose (not in a heading, link, table or code), or `forms` that match one",
                    term.entry.forms.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        seen.push((d, term));
    }
    problems
}

/// The site's own pages, which no section id may take: the page name and what it is.
const SITE_PAGES: &[(&str, &str)] =
    &[("index", "contents page"), ("print", "print view"), ("glossary", "glossary")];

/// Problems with the section ids the file names give: each must be usable in paths and page
/// names, and no two files may share one (both would be written to the same page).
fn section_problems(sources: &Sources, sections: &[String]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (i, (file, id)) in sources.markdown.iter().zip(sections).enumerate() {
        let name = file_name(&file.path);
        let expected = "a file name `NN-ID.md` whose ID is letters, digits, `-` and `_`, such as `03-cross-attention.md`";
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            let message = format!(
                "the file name gives the section id `{id}`, which cannot name a page or begin a path"
            );
            problems.push(Problem::new(i, 0, message, name, expected));
        } else if let Some((_, what)) = SITE_PAGES.iter().find(|(page, _)| page == id) {
            let message = format!("the section id `{id}` would overwrite the site's {what} ({id}.html)");
            problems.push(Problem::new(i, 0, message, name, expected));
        } else if let Some(first) = sections[..i].iter().position(|s| s == id) {
            let message = format!(
                "section id `{id}` is also the id of {}: both would be written to {id}.html",
                sources.markdown[first].path
            );
            problems.push(Problem::new(
                i,
                0,
                message,
                name,
                "one lesson file per section id: rename or remove one of them",
            ));
        }
    }
    problems
}

/// Links between sections that would lead nowhere on the site: to a `.md` file that is no section
/// of the course, or to an anchor that no heading of the target section has.
fn link_problems(sources: &Sources, docs: &[Document]) -> Vec<Problem> {
    let files: Vec<&str> = sources.markdown.iter().map(|f| file_name(&f.path)).collect();
    let mut problems = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        for link in &doc.links {
            let (file, anchor) = link.dest.split_once('#').unwrap_or((&link.dest, ""));
            let target = if file.is_empty() { Some(i) } else { linked_file(&sources.markdown, file) };
            let Some(target) = target else {
                let sections = files.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ");
                problems.push(Problem::new(
                    i,
                    link.at,
                    format!("a link to `{file}`, which is no section of the course: it would lead nowhere"),
                    &link.dest,
                    format!("a section's file name: {sections}"),
                ));
                continue;
            };
            if !anchor.is_empty() && !docs[target].anchors.iter().any(|a| a == anchor) {
                let anchors = &docs[target].anchors;
                let expected = if anchors.is_empty() {
                    "no anchor: the section has no headings below its title".to_string()
                } else {
                    let listed = anchors.iter().map(|a| format!("`#{a}`")).collect::<Vec<_>>().join(", ");
                    format!(
                        "the anchor of one of its headings (its words in lower case, joined by `-`): {listed}"
                    )
                };
                let message = format!("no heading of {} has the anchor `#{anchor}`", files[target]);
                problems.push(Problem::new(i, link.at, message, &link.dest, expected));
            }
        }
    }
    problems
}

/// The author's links and images to files other than sections that the course does not write: a
/// figure no block declares, a notebook no lab writes, a page by its site name (which leads
/// nowhere on a forge, where a section's `.md` file leads to both).
fn file_link_problems(
    sources: &Sources,
    docs: &[Document],
    figures: &[FigureJob],
    notebooks: &[OutputFile],
) -> Vec<Problem> {
    // Declared figures only: a leftover file in `figures/` is removed by the build.
    let mut written: BTreeSet<String> = figures
        .iter()
        .flat_map(|f| [format!("figures/{}.svg", f.id), format!("figures/{}.png", f.id)])
        .collect();
    written.extend(notebooks.iter().map(|n| n.name.clone()));
    // The site's own pages, which no section file stands for.
    written.extend(["index.html", "glossary.html", "print.html"].map(String::from));
    let mut problems = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        for link in &doc.file_links {
            let file = link.dest.split('#').next().unwrap_or_default();
            if written.contains(file) {
                continue;
            }
            let section = sources.markdown.iter().find(|f| format!("{}.html", section_id(&f.path)) == file);
            let (message, expected) = match section {
                Some(f) => (
                    format!("a link to `{file}`, a page by the name the site gives it: on a forge it leads nowhere"),
                    format!("the section's file, `{}`, which leads to its page on the site and on a forge", file_name(&f.path)),
                ),
                None => (
                    format!("a link to `{file}`, which the course does not write: it would lead nowhere"),
                    "a section's `.md` file, a figure (`figures/ID.svg`) or a lab's notebook the course writes, or an address (`https://…`)".to_string(),
                ),
            };
            problems.push(Problem::new(i, link.at, message, &link.dest, expected));
        }
    }
    problems
}

fn plan(sources: &Sources) -> Result<Plan, ContentErrors> {
    let sections: Vec<String> = sources.markdown.iter().map(|f| section_id(&f.path)).collect();
    // Everything else is keyed by section: with two files under one id, later errors would mislead.
    let mut problems = section_problems(sources, &sections);
    if !problems.is_empty() {
        return Err(locate(sources, problems));
    }
    let mut docs = Vec::new();
    for (i, file) in sources.markdown.iter().enumerate() {
        match document::parse(i, &file.text) {
            Ok(d) => docs.push(d),
            Err(p) => {
                problems.extend(p);
                docs.push(Document::default());
            }
        }
    }
    // A file that does not parse declares nothing: what the others use of it would only be
    // reported as unknown, burying the one mistake under errors that point elsewhere.
    if !problems.is_empty() {
        return Err(locate(sources, problems));
    }
    problems.extend(link_problems(sources, &docs));
    let (decls, broken) = examples::declarations(sources, &docs, &sections, &mut problems);
    let by_key: HashMap<String, &Decl> =
        decls.iter().map(|d| (format!("{}.{}", sections[d.doc], d.id), d)).collect();
    let mut eval = Evaluator::new(&sections, by_key.clone(), &sources.data);
    eval.broken = broken;
    let mut keys: Vec<(&String, &&Decl)> = by_key.iter().collect();
    keys.sort_by_key(|(_, d)| (d.doc, d.start));
    let mut records = Vec::new();
    for (key, decl) in &keys {
        if decl.kind.computes()
            && let Some(r) = eval.record(key)
        {
            records.push(((*key).clone(), r.node));
        }
    }

    let mut edits: Vec<Vec<Edit>> = (0..docs.len()).map(|_| Vec::new()).collect();
    // Citations.
    for (i, doc) in docs.iter().enumerate() {
        for c in &doc.citations {
            match citation::text(&mut eval, i, c, &sources.markdown[i].text[c.text.clone()]) {
                Ok(text) => {
                    edits[i].push(Edit { range: c.text.clone(), text, what: format!("citation {}", c.path) })
                }
                Err(p) => problems.push(p),
            }
        }
    }
    // Claims: what the prose says in words must still hold of the numbers.
    for decl in &decls {
        let DeclKind::Claims { holds } = &decl.kind else { continue };
        for claim in holds {
            match eval.compare(decl.doc, claim) {
                Ok((true, ..)) => {}
                Ok((false, a, b)) => problems.push(Problem::new(
                    decl.doc,
                    claim.at,
                    format!("a claim of the prose no longer holds: `{}` is false ({a} against {b})", claim.value.written),
                    claim.value.written.clone(),
                    "prose reworded to what the numbers now say (and this claim with it), or inputs for which it holds",
                )),
                Err(p) => problems.push(p),
            }
        }
    }
    // Generated regions.
    let mut figures_out = Vec::new();
    let mut region_html = Vec::new();
    let mut notebooks = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let mut page = Vec::new();
        // Generated text breaks lines with `\n`; a CRLF file gets CRLF throughout.
        let ending = LineEnding::of(&sources.markdown[i].text);
        for r in &doc.regions {
            match region::generate(
                &mut eval,
                &decls,
                &sections,
                i,
                &doc.regions,
                r,
                &sources.markdown[i].text,
            ) {
                Ok(generated) => {
                    let text = ending.apply(format!("\n{}\n", generated.body));
                    edits[i].push(Edit { range: r.body.clone(), text, what: generated.what });
                    // A figure or lab shown twice is drawn or written once.
                    if let Some(job) = generated.figure
                        && !figures_out.iter().any(|f: &FigureJob| f.id == job.id)
                    {
                        figures_out.push(job);
                    }
                    if let Some(nb) = generated.notebook {
                        match notebooks.iter().find(|n: &&OutputFile| n.name == nb.name) {
                            None => notebooks.push(nb),
                            Some(first) if first.text == nb.text => {}
                            Some(_) => problems.push(Problem::new(
                                i,
                                r.start,
                                format!(
                                    "this region writes {}, which another `lab` region writes differently",
                                    nb.name
                                ),
                                document::first_line(&sources.markdown[i].text[r.start..]),
                                "one `lab` region per query, or the same `digits` in both",
                            )),
                        }
                    }
                    page.push(generated.html);
                }
                Err(p) => problems.push(p),
            }
        }
        region_html.push(page);
    }
    problems.extend(region::misplaced(&decls, &docs));
    problems.extend(file_link_problems(sources, &docs, &figures_out, &notebooks));
    problems.extend(term_problems(sources, &decls));
    problems.append(&mut eval.problems);
    if !problems.is_empty() {
        return Err(locate(sources, problems));
    }
    let sections = docs
        .iter()
        .enumerate()
        .map(|(i, doc)| html::SectionInfo {
            summary: decls.iter().find_map(|d| match &d.kind {
                DeclKind::Page(p) if d.doc == i => match p.as_ref() {
                    PageDecl::Settings(s) => s.summary.clone(),
                    _ => None,
                },
                _ => None,
            }),
            checks: region::graded_checks(&decls, i, &doc.regions),
            terms: terms_of(&decls, i),
        })
        .collect();
    Ok(Plan { docs, edits, figures: figures_out, region_html, notebooks, records, sections })
}

#[cfg(test)]
mod tests;
