//! `measurements` figures: numbers measured outside the build (a benchmark's times), kept as a
//! TOML data file next to the lesson (read by [`crate::measured`]) and drawn as a line chart, one
//! line per series. The file says where its numbers came from; the build only reads and draws
//! them.

use qkv_plot::{LineChart, Scale, Series};

use super::{Deferred, LINE_SIZE, Plot, Prepared, hash_of};

/// The figure of data file `path` (see [`crate::measured::Measurements`]): both axes logarithmic,
/// so a cost linear in `x` is a line of slope 1, drawn beside the data as a guide through the
/// first series' first point.
pub(crate) fn prepare(path: &str, text: &str) -> Result<Prepared, String> {
    let data = crate::measured::parse(path, text)?;
    let x = data.x;
    let mut series: Vec<Series> = data.series.into_iter().map(|(name, y)| Series::new(name, y)).collect();
    let (x0, y0) = (x[0], series[0].values[0]);
    let guide =
        Series::reference(format!("linear in {}", data.x_name), x.iter().map(|&v| y0 * v / x0).collect());
    let (x_title, y_title) = (data.x_title, data.y_title);
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
    chart.title = data.title;
    chart.x_title = x_title;
    chart.y_title = y_title;
    chart.x_scale = Scale::Log;
    chart.y_scale = Scale::Log;
    chart.markers = true;
    let plot = Plot::Line(chart);
    let hash = hash_of(&format!("{plot:?}|{LINE_SIZE:?}|{alt}"));
    Ok(Prepared { hash, alt, size: LINE_SIZE, plot: Deferred::Ready(Box::new(plot)) })
}
