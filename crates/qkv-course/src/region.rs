//! Generated regions, `<!-- qkv KIND ARGS -->…<!-- /qkv -->`: one module per kind behind the
//! small interface below, registered in [`KINDS`]. A kind reads its directive and the evaluated
//! lesson through [`Context`] and returns what the region should hold ([`Generated`]): the
//! markdown body, and optionally the page's HTML for it, a figure to draw or a notebook. The
//! pipeline plans and splices; it never looks inside a region.
//!
//! Adding a kind is one new file here and one line in [`KINDS`].

mod error;
mod figure;
mod lab;
mod quiz;
mod steps;
mod table;
mod widget;

pub(crate) use quiz::graded_checks;

use crate::document::{Region, first_line};
use crate::error::Problem;
use crate::eval::{AttentionInputs, Computed, Evaluator};
use crate::examples::{Decl, DeclKind, PageDecl, SETTINGS_ID, Settings};
use crate::figures::FigureJob;
use crate::files::OutputFile;
use crate::format::DEFAULT_DIGITS;
use crate::limits::{self, MAX_SHOWN};

/// One kind of generated region.
pub(crate) struct Kind {
    /// The word after `qkv` in the opening marker.
    pub name: &'static str,
    /// How its directive is written, for messages.
    pub usage: &'static str,
    /// The `name=value` options it accepts (`digits` is read for every kind that lists it).
    pub options: &'static [&'static str],
    /// Computes the region's content.
    pub generate: fn(&mut Context<'_, '_>) -> Result<Generated, Problem>,
}

/// Every region kind, in the order messages list them.
const KINDS: &[Kind] =
    &[steps::KIND, table::KIND, error::KIND, lab::KIND, figure::KIND, quiz::KIND, widget::KIND];

/// What a region kind gets to work with: its directive, the evaluated lesson and the
/// declarations of every section.
pub(crate) struct Context<'a, 'e> {
    pub eval: &'a mut Evaluator<'e>,
    pub decls: &'a [Decl],
    pub sections: &'a [String],
    /// The document the region is in.
    pub doc: usize,
    /// Every region of that document, in reading order (quizzes are numbered by them).
    pub regions: &'a [Region],
    /// Byte offset of the region's opening marker.
    pub at: usize,
    /// The positional words of the directive after the kind.
    pub args: Vec<&'a str>,
    /// `digits=N`, or [`DEFAULT_DIGITS`].
    pub digits: usize,
    /// Every `name=value` option as written (`digits` among them), for the kinds that read more.
    pub options: Vec<(&'a str, &'a str)>,
    /// The kind and arguments as written, for stale reports (`steps sentence.love`).
    pub what: String,
    /// The opening marker's line, for messages.
    marker: String,
}

/// What a region holds after a build.
pub(crate) struct Generated {
    /// The markdown between the markers (without the surrounding newlines).
    pub body: String,
    /// How a stale report names the region.
    pub what: String,
    /// The page's HTML for the region, when it is more than its rendered markdown (a figure, a
    /// quiz, a widget).
    pub html: Option<String>,
    /// A figure the region shows, to be drawn if it is stale.
    pub figure: Option<FigureJob>,
    /// A notebook the site gets beside the page.
    pub notebook: Option<OutputFile>,
}

/// A record the region's first argument names, and what the argument says past the record.
pub(crate) struct Named {
    pub computed: Computed,
    /// Path segments after the declaration (`love` in `sentence.love`) and any part of it.
    pub rest: Vec<String>,
    /// How many segments named a part of the record (`heads.near` in `two.heads.near.love`).
    pub consumed: usize,
    /// The declaration's qualified id (`attention.sentence`).
    pub key: String,
}

impl<'a> Context<'a, '_> {
    /// A problem at the region's marker.
    pub(crate) fn problem(&self, message: impl Into<String>, expected: impl Into<String>) -> Problem {
        Problem::new(self.doc, self.at, message, self.marker.clone(), expected)
    }

    /// A problem with the directive's option `name` (`name=value`), placed at the option.
    pub(crate) fn option_problem(
        &self,
        name: &str,
        message: impl Into<String>,
        expected: impl Into<String>,
    ) -> Problem {
        let at = self.marker.find(&format!(" {name}=")).map_or(self.at, |i| self.at + i + 1);
        Problem::new(self.doc, at, message, self.marker.clone(), expected)
    }

    /// A problem when the region would show more than [`MAX_SHOWN`] of something: past that a
    /// table, worked example or figure is no longer readable.
    pub(crate) fn at_most_shown(&self, counts: &[(usize, &str)]) -> Result<(), Problem> {
        for &(count, what) in counts {
            if let Err(message) = limits::at_most(count, MAX_SHOWN, what, "one region shows") {
                return Err(self.problem(
                    format!("`{}` would show {message}", self.what.trim()),
                    "an example small enough for this region, or citations of single values",
                ));
            }
        }
        Ok(())
    }

    /// A region whose page shows just its markdown.
    pub(crate) fn markdown(&self, body: String) -> Generated {
        Generated { body, what: self.what.clone(), html: None, figure: None, notebook: None }
    }

    /// The first positional argument, the region's target.
    pub(crate) fn target(&self, usage: &str) -> Result<&'a str, Problem> {
        self.args.first().copied().ok_or_else(|| self.problem("generated region without a target", usage))
    }

    /// The record the target names.
    pub(crate) fn named(&mut self, usage: &str) -> Result<Named, Problem> {
        let target = self.target(usage)?;
        self.named_path(target)
    }

    /// The record `target` (a path such as `sentence.love`) names.
    pub(crate) fn named_path(&mut self, target: &str) -> Result<Named, Problem> {
        let target = target.to_string();
        let t = self
            .eval
            .target(self.doc, &target)
            .map_err(|expected| self.problem(format!("unknown reference `{target}`"), expected))?;
        let record = self
            .eval
            .record(&t.key)
            .ok_or_else(|| self.problem(format!("`{target}` has errors (see above)"), ""))?;
        let rest: Vec<String> = t.rest.iter().map(|s| s.to_string()).collect();
        let (computed, taken) = record.computed.part(&rest);
        Ok(Named { computed, rest: rest[taken..].to_vec(), consumed: taken, key: t.key })
    }

    /// The query a target's rest names (`love` in `sentence.love`), by label or 1-based number.
    pub(crate) fn query_index(
        &self,
        target: &str,
        inputs: &AttentionInputs,
        rest: &[String],
    ) -> Result<usize, Problem> {
        let labels = inputs.query_labels();
        let [token] = rest else {
            return Err(self.problem(
                format!("`{target}` needs one query token after the example"),
                format!("`{target}.TOKEN` with TOKEN one of {}", labels.join(", ")),
            ));
        };
        labels
            .iter()
            .position(|l| l == token)
            .or_else(|| {
                token.parse::<usize>().ok().and_then(|p| p.checked_sub(1)).filter(|&p| p < labels.len())
            })
            .ok_or_else(|| {
                self.problem(
                    format!(
                        "`{token}` is not a query of `{}`",
                        target.rsplit_once('.').map_or(target, |(e, _)| e)
                    ),
                    format!("one of {}", labels.join(", ")),
                )
            })
    }

    /// The page block (quiz, widget, settings) of this document with id `id`.
    pub(crate) fn page_decl(&self, id: &str) -> Option<&'a PageDecl> {
        self.decls.iter().find_map(|d| match &d.kind {
            DeclKind::Page(page) if d.doc == self.doc && d.id == id => Some(page.as_ref()),
            _ => None,
        })
    }

    /// The block of this document with id `id` that `pick` accepts (a `qkv quiz` or `qkv widget`,
    /// named `what` in messages).
    pub(crate) fn page_block<T>(
        &self,
        id: &str,
        what: &str,
        pick: impl Fn(&'a PageDecl) -> Option<T>,
    ) -> Result<T, Problem> {
        if let Some(found) = self.page_decl(id).and_then(&pick) {
            return Ok(found);
        }
        if self.eval.broken.contains(&format!("{}.{id}", self.sections[self.doc])) {
            // The block's own error says what is wrong.
            return Err(self.problem(String::new(), ""));
        }
        let ids: Vec<&str> = self
            .decls
            .iter()
            .filter(|d| d.doc == self.doc && matches!(&d.kind, DeclKind::Page(p) if pick(p).is_some()))
            .map(|d| d.id.as_str())
            .collect();
        let ids = if ids.is_empty() { "(none in this file)".to_string() } else { ids.join(", ") };
        Err(self.problem(
            format!("unknown {what} `{id}`"),
            format!("the id of a `qkv {what}` block in this file: {ids}"),
        ))
    }

    /// The section's settings (its `qkv settings` block), or the defaults.
    pub(crate) fn settings(&self) -> Settings {
        match self.page_decl(SETTINGS_ID) {
            Some(PageDecl::Settings(s)) => s.clone(),
            _ => Settings { credit: None, notebook_repository: None, summary: None },
        }
    }
}

/// Page blocks (quizzes, widgets) that no region of their file shows, or that two regions show:
/// each must appear on the page exactly once.
pub(crate) fn misplaced(decls: &[Decl], docs: &[crate::document::Document]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for d in decls {
        let kind = match &d.kind {
            DeclKind::Page(p) => match p.as_ref() {
                PageDecl::Quiz(_) => "quiz",
                PageDecl::Widget(_) => "widget",
                PageDecl::Settings(_) | PageDecl::Term(_) => continue,
            },
            _ => continue,
        };
        let shown: Vec<&Region> = docs[d.doc]
            .regions
            .iter()
            .filter(|r| r.directive.first().is_some_and(|k| k == kind) && r.directive.get(1) == Some(&d.id))
            .collect();
        let marker = format!("<!-- qkv {kind} {} -->", d.id);
        match shown.as_slice() {
            [_] => {}
            [] => problems.push(Problem::new(
                d.doc,
                d.id_at,
                format!("{kind} `{}` is declared but no region shows it", d.id),
                format!("id = \"{}\"", d.id),
                format!("`{marker}` and `<!-- /qkv -->` where it goes on the page"),
            )),
            [_, again @ ..] => {
                for r in again {
                    problems.push(Problem::new(
                        d.doc,
                        r.start,
                        format!("{kind} `{}` is shown twice", d.id),
                        marker.clone(),
                        "one region per quiz or widget",
                    ));
                }
            }
        }
    }
    problems
}

/// Computes one region of document `doc` (whose text is `text` and whose regions are `regions`).
pub(crate) fn generate(
    eval: &mut Evaluator<'_>,
    decls: &[Decl],
    sections: &[String],
    doc: usize,
    regions: &[Region],
    region: &Region,
    text: &str,
) -> Result<Generated, Problem> {
    let name = region.directive.first().map_or("", String::as_str);
    let mut cx = Context {
        eval,
        decls,
        sections,
        doc,
        regions,
        at: region.start,
        args: Vec::new(),
        digits: DEFAULT_DIGITS,
        options: Vec::new(),
        what: String::new(),
        marker: first_line(&text[region.start..]),
    };
    let Some(kind) = KINDS.iter().find(|k| k.name == name) else {
        return Err(cx.problem(format!("unknown generated region `{name}`"), usage_list()));
    };
    for word in region.directive.iter().skip(1) {
        match word.split_once('=') {
            Some((option, value)) if kind.options.contains(&option) => {
                cx.options.push((option, value));
                if option == "digits" {
                    cx.digits = value.parse().ok().filter(|&d| d <= 12).ok_or_else(|| {
                        cx.option_problem(
                            option,
                            format!("bad `digits={value}`"),
                            "`digits=N` with N from 0 to 12",
                        )
                    })?;
                }
            }
            Some((option, _)) => {
                let accepted: Vec<String> = kind.options.iter().map(|o| format!("`{o}=N`")).collect();
                let expected = if accepted.is_empty() {
                    format!("no options: {}", kind.usage)
                } else {
                    accepted.join(", ")
                };
                return Err(cx.option_problem(option, format!("unknown option `{option}`"), expected));
            }
            None => cx.args.push(word),
        }
    }
    cx.what = format!("{name} {}", cx.args.join(" "));
    (kind.generate)(&mut cx)
}

/// Every kind's usage, for the message about an unknown kind.
fn usage_list() -> String {
    KINDS.iter().map(|k| k.usage).collect::<Vec<_>>().join(", ")
}

/// One-section lessons for the tests of the region kinds (and of the page).
#[cfg(test)]
pub(crate) mod testing {
    use crate::files::{SourceFile, Sources};
    use crate::pipeline::build;

    /// The running example, "I love NLP", as a block.
    pub(crate) const SENTENCE: &str = r#"```qkv attention
id = "sentence"
tokens = ["I", "love", "NLP"]
queries = [[1, 0], [0, 1], [1, 1]]
keys = [[1, 0], [0, 1], [1, 1]]
values = [[2], [6], [4]]
```
"#;

    /// Builds a lesson of one section, `content/01-NAME.md`: its updated markdown and its page.
    pub(crate) fn one_section(name: &str, text: &str) -> (String, String) {
        let sources = Sources {
            markdown: vec![SourceFile { path: format!("content/01-{name}.md"), text: text.into() }],
            ..Default::default()
        };
        let built = build(&sources).unwrap_or_else(|e| panic!("{e}"));
        let page = built.site.iter().find(|f| f.name == format!("{name}.html")).expect("the page");
        (built.markdown[0].text.clone(), page.text.clone())
    }
}
