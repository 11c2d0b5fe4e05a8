//! `measurements` figures: numbers measured outside the build (a benchmark's times), kept as a
//! TOML data file next to the lesson and drawn as a line chart, one line per series. The file
//! says where its numbers came from; the build only reads and draws them.

use qkv_plot::{LineChart, Scale, Series};

use super::{Deferred, LINE_SIZE, Plot, Prepared, hash_of};

/// What a data file holds: `title`, `x_title`, `y_title`, `x` (increasing, above zero), and
/// `[[series]]` tables of `name` and `y` (one value per `x`, above zero); both axes are
/// logarithmic, so a cost linear in `x` is a line of slope 1, drawn beside the data as a guide
/// through the first series' first point. Any other field (the machine, the command) is for the
/// reader of the file.
pub(crate) fn prepare(path: &str, text: &str) -> Result<Prepared, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        format!("a TOML data file (`{path}` does not read: {})", e.message())
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
    let mut series = Vec::new();
    for (i, s) in tables.iter().enumerate() {
        let what = format!("series {}", i + 1);
        let name = s
            .get("name")
            .and_then(toml::Value::as_str)
            .ok_or_else(|| format!("a `name` for {what} of `{path}`"))?;
        let y = numbers(s.get("y"), &format!("y` of `{what}"))?;
        if y.len() != x.len() {
            return Err(format!("{} values in `y` of {what} of `{path}`, one per `x`", x.len()));
        }
        series.push(Series::new(name, y));
    }
    let (x0, y0) = (x[0], series[0].values[0]);
    let guide = Series::reference(
        format!("linear in {}", string("x_name")?),
        x.iter().map(|&v| y0 * v / x0).collect(),
    );
    let (x_title, y_title) = (string("x_title")?, string("y_title")?);
    let alt = format!(
        "Line chart of {y_title} against {x_title} ({}), both axes logarithmic: {}; the dashed guide grows linearly.",
        x.iter().map(|v| format!("{v}")).collect::<Vec<_>>().join(", "),
        series
            .iter()
            .map(|s| {
                let shown: Vec<String> = s.values.iter().map(|&v| crate::format::shown(v, 2).text).collect();
                format!("{} {}", s.label, shown.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    );
    series.push(guide);
    let mut chart = LineChart::new(x, series);
    chart.title = string("title")?;
    chart.x_title = x_title;
    chart.y_title = y_title;
    chart.x_scale = Scale::Log;
    chart.y_scale = Scale::Log;
    chart.markers = true;
    let plot = Plot::Line(chart);
    let hash = hash_of(&format!("{plot:?}|{LINE_SIZE:?}|{alt}"));
    Ok(Prepared { hash, alt, size: LINE_SIZE, plot: Deferred::Ready(Box::new(plot)) })
}
