//! Measured numbers: a TOML data file next to the lesson (`content/data/NAME.toml`) holding a
//! benchmark's results, read once into [`Measurements`]. A `measurements` figure draws them, and
//! the lesson cites them through the figure's id (`decode-cost.f32.growth`), so that the prose
//! about a plot says what the plot shows.

use crate::values::Node;

/// What a data file holds: `title`, `x_name`, `x_title`, `y_title`, `x` (increasing, above zero),
/// and `[[series]]` tables of `name` and `y` (one value per `x`, above zero). Any other field (the
/// machine, the command) is for the reader of the file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measurements {
    pub title: String,
    /// What `x` counts, for the guide's name ("linear in n").
    pub x_name: String,
    pub x_title: String,
    pub y_title: String,
    pub x: Vec<f64>,
    /// Each series' name and values, in the file's order.
    pub series: Vec<(String, Vec<f64>)>,
}

/// Reads data file `path`; `Err` says what was expected instead.
pub(crate) fn parse(path: &str, text: &str) -> Result<Measurements, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        // Where in the data file: the error is reported at the figure's `data` field.
        let place = e.span().map_or_else(String::new, |span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
            format!(" at line {line}, column {column}")
        });
        format!("a TOML data file (`{path}` does not read{place}: {})", e.message().trim_end())
    })?;
    let string = |name: &str| -> Result<String, String> {
        table
            .get(name)
            .and_then(toml::Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("a string `{name}` in `{path}`"))
    };
    let numbers = |value: Option<&toml::Value>, what: &str| -> Result<Vec<f64>, String> {
        let list =
            value.and_then(toml::Value::as_array).ok_or_else(|| format!("a list `{what}` in `{path}`"))?;
        list.iter()
            .map(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))
            .map(|x| x.filter(|x| x.is_finite() && *x > 0.0))
            .collect::<Option<Vec<f64>>>()
            .ok_or_else(|| format!("numbers above zero in `{what}` of `{path}` (the axes are logarithmic)"))
    };
    let x = numbers(table.get("x"), "x")?;
    if x.is_empty() || x.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("`x` of `{path}` in increasing order, with at least one value"));
    }
    let tables = table
        .get("series")
        .and_then(toml::Value::as_array)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("`[[series]]` tables (`name`, `y`) in `{path}`"))?;
    let mut series: Vec<(String, Vec<f64>)> = Vec::new();
    for (i, s) in tables.iter().enumerate() {
        let what = format!("series {}", i + 1);
        // A misspelt field would read as a missing one.
        if let Some(other) =
            s.as_table().and_then(|t| t.keys().find(|k| !["name", "y"].contains(&k.as_str())))
        {
            let hint = crate::error::closest(other, &["name", "y"])
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            return Err(format!("only `name` and `y` in {what} of `{path}`, not `{other}`{hint}"));
        }
        let name = s
            .get("name")
            .and_then(toml::Value::as_str)
            .ok_or_else(|| format!("a `name` for {what} of `{path}`"))?;
        // The name is a segment of the paths that cite the series.
        if name.is_empty() || name.contains(['.', ':']) || name.contains(char::is_whitespace) {
            return Err(format!(
                "a `name` for {what} of `{path}` without spaces, `.` or `:` (it names the series in a citation's path), not {name:?}"
            ));
        }
        if series.iter().any(|(n, _)| n == name) || FIELDS.contains(&name) {
            return Err(format!(
                "a `name` for {what} of `{path}` that no other series and no field (`x`, `x_growth`) has, not {name:?}"
            ));
        }
        let y = numbers(s.get("y"), &format!("y` of `{what}"))?;
        if y.len() != x.len() {
            return Err(format!("{} values in `y` of {what} of `{path}`, one per `x`", x.len()));
        }
        series.push((name.to_string(), y));
    }
    Ok(Measurements {
        title: string("title")?,
        x_name: string("x_name")?,
        x_title: string("x_title")?,
        y_title: string("y_title")?,
        x,
        series,
    })
}

/// The record's own fields, beside the series' names.
const FIELDS: &[&str] = &["x", "x_growth"];

/// How much `xs` grows: last over first, and the least and largest ratio of one point to the one
/// before (1 each for a single point).
fn growth(xs: &[f64]) -> (f64, f64, f64) {
    let steps: Vec<f64> = xs.windows(2).map(|w| w[1] / w[0]).collect();
    let (least, most) =
        steps.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &r| (a.min(r), b.max(r)));
    let whole = xs.last().zip(xs.first()).map_or(1.0, |(last, first)| last / first);
    if steps.is_empty() { (whole, 1.0, 1.0) } else { (whole, least, most) }
}

impl Measurements {
    /// What the lesson cites: `x.N` and `x_growth` (the last `x` over the first); per series
    /// `SERIES.y.N`, `SERIES.growth` (its last value over its first) and `SERIES.step_min`,
    /// `SERIES.step_max` (the least and largest ratio of a value to the one before it: at
    /// doubling `x`, what one doubling does).
    pub(crate) fn node(&self) -> Node {
        let mut entries = vec![
            ("x".to_string(), Node::vector(&self.x)),
            ("x_growth".to_string(), Node::Number(growth(&self.x).0)),
        ];
        for (name, y) in &self.series {
            let (whole, least, most) = growth(y);
            entries.push((
                name.clone(),
                Node::Map(vec![
                    ("y", Node::vector(y)),
                    ("growth", Node::Number(whole)),
                    ("step_min", Node::Number(least)),
                    ("step_max", Node::Number(most)),
                ]),
            ));
        }
        Node::Record(entries)
    }
}

#[cfg(test)]
mod tests;
