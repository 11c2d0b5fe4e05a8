//! `cargo xtask attend`: the authors' calculator. Attention on numbers typed inline or read from
//! `.npy` files, printed as a table, a worked trace, or JSON.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ndarray::Array2;
use qkv::{AttentionOptions, CausalMask, QueryTrace, Real};
use serde_json::{Value, json};

use crate::cli::{Args, say, usage};

const HELP: &str = "\
usage: cargo xtask attend (--query V | --queries M) --keys M --values M [options]
       cargo xtask attend --q Q.npy --k K.npy --v V.npy [--out O.npy] [options]

inline numbers: rows separated by `;`, components by `,`: --keys \"1,0; 0,1; 1,1\" --values \"2; 6; 4\"
files: NumPy .npy, f32 or f64, 2-D [n, d]

options:
  --causal              hide keys after each query (aligned bottom-right when n_q < n_k)
  --scale X             multiply dot products by X instead of 1/sqrt(d_k)
  --precision f32|f64   compute in this type (default: f32 if every input file is f32, else f64)
  --steps               print every intermediate of each query
  --json                print {\"scores\": [[..]], \"weights\": [[..]], \"output\": [[..]]}
                        (hidden scores are null; with --out the output goes to the file only)";

/// Tables larger than this are left to `--json` rather than printed.
const PRINT_LIMIT: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Precision {
    F32,
    F64,
}

struct Request {
    q: Array2<f64>,
    k: Array2<f64>,
    v: Array2<f64>,
    precision: Precision,
    causal: bool,
    scale: Option<f64>,
    steps: bool,
    json: bool,
    out: Option<PathBuf>,
}

/// Runs the calculator on the arguments after `attend`.
pub fn run(args: Vec<String>) -> anyhow::Result<()> {
    let mut args = Args::new("attend", args);
    if args.flag("--help") || args.flag("-h") {
        say!("{HELP}");
        return Ok(());
    }
    let request = parse(&mut args)?;
    args.finish()?;
    match request.precision {
        Precision::F64 => compute::<f64>(&request),
        Precision::F32 => compute::<f32>(&request),
    }
}

fn parse(args: &mut Args) -> anyhow::Result<Request> {
    let causal = args.flag("--causal");
    let steps = args.flag("--steps");
    let json = args.flag("--json");
    let scale = match args.value("--scale")? {
        None => None,
        Some(text) => Some(parse_number("--scale", &text, &text)?),
    };
    let precision = args.value("--precision")?;
    let inline =
        [args.value("--query")?, args.value("--queries")?, args.value("--keys")?, args.value("--values")?];
    let files = [args.value("--q")?, args.value("--k")?, args.value("--v")?];
    let out = args.value("--out")?.map(PathBuf::from);

    let (q, k, v, all_f32) = match (inline, files) {
        ([query, queries, Some(keys), Some(values)], [None, None, None]) => {
            let q = match (query, queries) {
                (Some(text), None) => parse_matrix("--query", &text.replace(';', " "))?,
                (None, Some(text)) => parse_matrix("--queries", &text)?,
                _ => {
                    return usage(
                        "give exactly one of --query (one vector) or --queries (rows separated by `;`)",
                    );
                }
            };
            (q, parse_matrix("--keys", &keys)?, parse_matrix("--values", &values)?, false)
        }
        ([None, None, None, None], [Some(q), Some(k), Some(v)]) => {
            let (q, q32) = read_npy("--q", Path::new(&q))?;
            let (k, k32) = read_npy("--k", Path::new(&k))?;
            let (v, v32) = read_npy("--v", Path::new(&v))?;
            (q, k, v, q32 && k32 && v32)
        }
        _ => {
            return usage(
                "give the inputs either inline (--query or --queries, --keys, --values) or as files (--q, --k, --v), \
                 all three of one kind\n\n"
                    .to_string()
                    + HELP,
            );
        }
    };
    let precision = match precision.as_deref() {
        None if all_f32 => Precision::F32,
        None | Some("f64") => Precision::F64,
        Some("f32") => Precision::F32,
        Some(other) => return usage(format!("--precision `{other}`: expected f32 or f64")),
    };
    Ok(Request { q, k, v, precision, causal, scale, steps, json, out })
}

/// Parses `"1,0; 0,1"` into a matrix; every row must have the same number of components.
fn parse_matrix(flag: &str, text: &str) -> anyhow::Result<Array2<f64>> {
    let rows: Vec<Vec<f64>> = text
        .split(';')
        .map(|row| row.split(',').map(|x| parse_number(flag, x.trim(), text)).collect::<Result<Vec<_>, _>>())
        .collect::<Result<_, _>>()?;
    let width = rows[0].len();
    if let Some((i, row)) = rows.iter().enumerate().find(|(_, r)| r.len() != width) {
        return usage(format!(
            "{flag} \"{text}\": row {i} has {} components but row 0 has {width}; expected rows of equal \
             length separated by `;`, components by `,`",
            row.len()
        ));
    }
    let n = rows.len();
    Ok(Array2::from_shape_vec((n, width), rows.concat()).expect("rows of equal width"))
}

fn parse_number(flag: &str, item: &str, whole: &str) -> anyhow::Result<f64> {
    match item.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => {
            usage(format!("{flag} \"{whole}\": `{item}` is not a finite number; expected e.g. 0.5, -2, 1e-3"))
        }
    }
}

/// Reads a 2-D `.npy` of f64 or f32 (widened); says whether it was f32.
fn read_npy(flag: &str, path: &Path) -> anyhow::Result<(Array2<f64>, bool)> {
    let as_f64 = ndarray_npy::read_npy::<_, Array2<f64>>(path);
    match as_f64 {
        Ok(a) => Ok((a, false)),
        Err(first) => match ndarray_npy::read_npy::<_, Array2<f32>>(path) {
            Ok(a) => Ok((a.mapv(f64::from), true)),
            Err(_) => {
                usage(format!("{flag} {}: {first}; expected a 2-D .npy file of f32 or f64", path.display()))
            }
        },
    }
}

fn compute<T: Real + ndarray_npy::WritableElement>(r: &Request) -> anyhow::Result<()> {
    let narrow = |a: &Array2<f64>| a.mapv(T::from_f64_round);
    let (q, k, v) = (narrow(&r.q), narrow(&r.k), narrow(&r.v));
    let mut options = AttentionOptions::new();
    if r.causal {
        options = options.causal(CausalMask::BottomRight);
    }
    if let Some(s) = r.scale {
        options = options.scale(T::from_f64_round(s));
    }
    let bad_input = |e: qkv::AttentionError| crate::cli::UsageError(e.to_string());

    if let Some(path) = &r.out {
        let out = qkv::attention(q.view(), k.view(), v.view(), &options).map_err(bad_input)?;
        write_npy_atomically(path, &out)?;
        if !r.json {
            eprintln!("wrote output {:?} ({}) to {}", out.shape(), T::NAME, path.display());
        }
    }
    if r.out.is_some() && !r.json && !r.steps {
        return Ok(());
    }
    let result = qkv::attention_with_weights(q.view(), k.view(), v.view(), &options).map_err(bad_input)?;
    let wide = |a: &Array2<T>| a.mapv(Real::to_f64_exact);
    let (scores, weights, output) = (wide(&result.scores), wide(&result.weights), wide(&result.output));
    if r.json {
        let mut doc = json!({ "scores": rows_json(&scores), "weights": rows_json(&weights) });
        if r.out.is_none() {
            doc["output"] = rows_json(&output);
        }
        say!("{doc}");
        return Ok(());
    }
    if r.steps {
        for i in 0..q.nrows() {
            let trace = qkv::trace_query(q.view(), k.view(), v.view(), i, &options).map_err(bad_input)?;
            say!("{}", format_trace(i, &trace).trim_end());
        }
        return Ok(());
    }
    say!("{} queries × {} keys, d_k = {}, d_v = {}, {}", q.nrows(), k.nrows(), k.ncols(), v.ncols(), T::NAME);
    if scores.nrows() <= PRINT_LIMIT && scores.ncols() <= PRINT_LIMIT {
        print_table("scaled scores", &scores)?;
        print_table("weights", &weights)?;
    } else {
        say!(
            "(the {} × {} score and weight matrices are left out; use --json)",
            scores.nrows(),
            scores.ncols()
        );
    }
    print_table("output", &output)?;
    Ok(())
}

fn rows_json(a: &Array2<f64>) -> Value {
    // JSON has no -inf: a hidden score is null.
    Value::Array(
        a.rows()
            .into_iter()
            .map(|row| row.iter().map(|x| if x.is_finite() { json!(x) } else { Value::Null }).collect())
            .collect(),
    )
}

fn print_table(title: &str, a: &Array2<f64>) -> std::io::Result<()> {
    say!("{title}:");
    for (i, row) in a.rows().into_iter().enumerate() {
        let cells: Vec<String> = row.iter().map(|x| format_cell(*x)).collect();
        say!("  query {i}: {}", cells.join("  "));
    }
    Ok(())
}

fn format_cell(x: f64) -> String {
    if x == f64::NEG_INFINITY { format!("{:>8}", "masked") } else { format!("{x:>8.4}") }
}

fn format_list(xs: &[f64]) -> String {
    xs.iter().map(|x| format_cell(*x).trim().to_string()).collect::<Vec<_>>().join(", ")
}

fn format_trace(i: usize, t: &QueryTrace) -> String {
    let terms: Vec<String> =
        t.weighted_values.iter().map(|term| format!("({})", format_list(term))).collect();
    let lines = [
        ("dot products q·k_i".to_string(), format_list(&t.dot_products)),
        (format!("× scale {:.4}", t.scale), format_list(&t.scores)),
        (
            "row max".to_string(),
            t.max.map_or("none (every key is hidden)".to_string(), |m| format!("{m:.4}")),
        ),
        ("minus the max".to_string(), format_list(&t.shifted)),
        ("exponentials".to_string(), format_list(&t.exponentials)),
        ("sum".to_string(), format!("{:.4}", t.sum)),
        ("weights".to_string(), format_list(&t.weights)),
        ("weighted values a_i·v_i".to_string(), terms.join(" + ")),
        ("output".to_string(), format!("({})", format_list(&t.output))),
    ];
    let mut text = format!("query {i} = ({})\n", format_list(&t.query));
    for (label, value) in lines {
        text += &format!("  {label:<26}{value}\n");
    }
    text
}

/// Writes beside the target, then renames: a failed write never leaves half a file.
fn write_npy_atomically<T: ndarray_npy::WritableElement>(path: &Path, a: &Array2<T>) -> anyhow::Result<()> {
    let tmp = path.with_extension("npy.tmp");
    ndarray_npy::write_npy(&tmp, a).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
