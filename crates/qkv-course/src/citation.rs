//! A citation's text: the number its path names, in its format (`[4.41](=sentence.love.output:2)`
//! in prose, `{4.41}\vphantom{\verb|=sentence.love.output:2|}` in math).

use crate::document::Citation;
use crate::error::Problem;
use crate::eval::Evaluator;

/// What citation `c` of document `doc` should say; `found` is what it says now.
pub(crate) fn text(
    eval: &mut Evaluator<'_>,
    doc: usize,
    c: &Citation,
    found: &str,
) -> Result<String, Problem> {
    let node = eval.resolve(doc, &c.path).map_err(|expected| {
        Problem::new(doc, c.path_at, format!("unknown reference `{}`", c.path), c.path.clone(), expected)
    })?;
    match node.as_number() {
        // In TeX `%` starts a comment: a percentage in math is `12.5\%`.
        Some(x) if x.is_finite() && c.math => Ok(c.format.apply(x).replace('%', r"\%")),
        Some(x) if x.is_finite() => Ok(c.format.apply(x)),
        Some(x) => Err(Problem::new(
            doc,
            c.path_at,
            format!("`{}` is {x}, which cannot be shown as a number", c.path),
            found,
            "a finite value (a masked score is -inf; cite its weight instead)",
        )),
        None => Err(Problem::new(
            doc,
            c.path_at,
            format!("`{}` is not a single number", c.path),
            c.path.clone(),
            format!(
                "a path down to one number, such as `{}.{}`",
                c.path,
                node.children().first().map_or("1", String::as_str)
            ),
        )),
    }
}
