//! `figure ID`: the image of a `qkv figure` block of the same file, its caption and the hash of
//! its inputs. The markdown links the SVG (so the lesson reads on a forge); the page shows it as a
//! `<figure>`. Drawing is left to the pipeline, which draws only figures whose hash changed.

use super::{Context, Generated, Kind};
use crate::error::Problem;
use crate::eval::Computed;
use crate::examples::{DeclKind, FigureDecl};
use crate::figure_kind::FigureKind;
use crate::figures::{self, FigureJob, Prepared};
use crate::markup::{escape, inline_markdown};

pub(super) const KIND: Kind = Kind { name: "figure", usage: "`figure ID`", options: &[], generate };

fn generate(cx: &mut Context<'_, '_>) -> Result<Generated, Problem> {
    let id = cx.target(KIND.usage)?;
    let (decl_start, fig) = cx
        .decls
        .iter()
        .find_map(|d| match &d.kind {
            DeclKind::Figure(fig) if d.doc == cx.doc && d.id == id => Some((d.start, fig.as_ref())),
            _ => None,
        })
        .ok_or_else(|| {
            if cx.eval.broken.contains(&format!("{}.{id}", cx.sections[cx.doc])) {
                // The block's own error says what is wrong.
                return cx.problem(String::new(), "");
            }
            let known: Vec<&str> = cx
                .decls
                .iter()
                .filter(|d| d.doc == cx.doc && matches!(d.kind, DeclKind::Figure(_)))
                .map(|d| d.id.as_str())
                .collect();
            let expected = if known.is_empty() {
                format!("a `qkv figure` block with `id = \"{id}\"` in this file, which has none")
            } else {
                format!("the id of a `qkv figure` block in this file: {}", known.join(", "))
            };
            cx.problem(format!("unknown figure `{id}`"), expected)
        })?;
    let prepared = prepare(cx, id, decl_start, fig)?;
    let caption = match &fig.caption {
        Some(text) => text.fill(cx.eval, cx.doc)?,
        None => String::new(),
    };
    let caption = caption.trim();
    let body = format!(
        "![{}](figures/{id}.svg)\n\n*{caption}* ([PNG](figures/{id}.png))\n\n<!-- {}{} -->\n",
        escape_alt(&prepared.alt),
        crate::files::DRAWN_FROM,
        prepared.hash
    );
    let html = format!(
        "<figure id=\"figure-{0}\">\n<a href=\"figures/{0}.png\"><img src=\"figures/{0}.svg\" alt=\"{1}\" width=\"{3}\" height=\"{4}\" loading=\"lazy\"></a>\n<figcaption>{2}</figcaption>\n</figure>\n",
        escape(id),
        escape(&prepared.alt),
        inline_markdown(caption),
        prepared.size.width,
        prepared.size.height
    );
    Ok(Generated {
        body,
        what: format!("figure {id}"),
        html: Some(html),
        figure: Some(FigureJob { id: id.to_string(), doc: cx.doc, at: cx.at, prepared }),
        notebook: None,
    })
}

/// The figure's plot input and hash: from its example (and followed query), or Monte Carlo.
fn prepare(
    cx: &mut Context<'_, '_>,
    id: &str,
    decl_start: usize,
    fig: &FigureDecl,
) -> Result<Prepared, Problem> {
    let doc = cx.doc;
    let problem = |at: usize, message: String, found: String, expected: String| {
        Problem::new(doc, at, message, found, expected)
    };
    if let (FigureKind::Measurements, Some(data)) = (fig.kind, &fig.data) {
        let text = cx.eval.data.get(&data.value).ok_or_else(|| {
            let known: Vec<&str> = cx.eval.data.keys().map(String::as_str).collect();
            problem(
                data.at,
                format!("no data file `{}` next to the lesson", data.value),
                data.value.clone(),
                if known.is_empty() {
                    "a file `content/data/NAME.toml`, named here as `data/NAME.toml`".to_string()
                } else {
                    format!("one of {}", known.join(", "))
                },
            )
        })?;
        return figures::prepare_measurements(&data.value, text).map_err(|expected| {
            problem(data.at, format!("`{}` cannot be drawn", data.value), data.value.clone(), expected)
        });
    }
    if !fig.kind.needs_example() {
        return Ok(figures::prepare_scaling(fig));
    }
    let example = fig.example.as_ref().ok_or_else(|| {
        problem(
            decl_start,
            format!("figure `{id}` has no `example`"),
            format!("id = \"{id}\""),
            "`example = \"ID\"` naming an attention example".into(),
        )
    })?;
    // The example may be a part of a record (a head of a multi-head example); a broken one
    // reports its own error, and the figure stays quiet.
    let named = cx.named_path(&example.value).map_err(|p| Problem {
        at: example.at,
        found: example.value.clone(),
        ..p
    })?;
    let drawing = |e: String| {
        problem(
            decl_start,
            format!("figure `{id}` cannot be drawn from `{}`", example.value),
            format!("id = \"{id}\""),
            e,
        )
    };
    if fig.kind == FigureKind::TileTrace {
        let (Computed::Tiled(t), true) = (named.computed, named.rest.is_empty()) else {
            return Err(problem(
                example.at,
                format!("`{}` is not a `qkv tiled` block", example.value),
                example.value.clone(),
                "the id of a `qkv tiled` block: a `tile-trace` figure follows its blocks".into(),
            ));
        };
        cx.at_most_shown(&[(t.trace.blocks.len(), "blocks")])?;
        return figures::prepare_tiled(&t).map_err(drawing);
    }
    let (Computed::Attention { inputs, result: Ok(result) }, true) = (named.computed, named.rest.is_empty())
    else {
        return Err(problem(
            example.at,
            format!("`{}` is not an attention example that computes", example.value),
            example.value.clone(),
            "the id of a `qkv attention` block, or `MULTIHEAD.heads.HEAD`".into(),
        ));
    };
    let widths = inputs.values.first().map_or(0, Vec::len);
    let shown = match fig.kind {
        // A heatmap has a row per query; the other kinds draw one query against every key.
        FigureKind::Heatmap => vec![(inputs.queries.len(), "queries"), (inputs.keys.len(), "keys")],
        _ => vec![(inputs.keys.len(), "keys"), (widths, "components of a value")],
    };
    cx.at_most_shown(&shown)?;
    let labels = inputs.query_labels();
    let query = match &fig.query {
        Some(q) => Some(labels.iter().position(|l| *l == q.value).ok_or_else(|| {
            problem(
                q.at,
                format!("`{}` is not a query of `{}`", q.value, example.value),
                q.value.clone(),
                format!("one of {}", labels.join(", ")),
            )
        })?),
        None if fig.kind.needs_query() => {
            return Err(problem(
                decl_start,
                format!("a `{}` figure needs `query`", fig.kind.name()),
                format!("id = \"{id}\""),
                format!("`query = \"TOKEN\"`, one of {}", labels.join(", ")),
            ));
        }
        None => None,
    };
    figures::prepare_example(fig, &inputs, &result, query).map_err(drawing)
}

/// Alt text as markdown link text: the characters markdown would read as syntax, escaped.
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
