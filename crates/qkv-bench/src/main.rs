//! qkv's benchmark: times the fast path (all threads and one), the f64 reference, the unfused
//! peers, NumPy and PyTorch (with `--python`), the machine's f32 GEMM rate (and, on an AMX CPU,
//! its tile unit's: `tiles.rs`) and, for decoding steps, a streaming read of as many bytes;
//! prints one table, and with `--json` writes the rows and a bar chart of them.
//!
//! `cargo run --release -p qkv-bench --features peers -- [--quick] [--json FILE] [--only TEXT]
//! [--python PYTHON]` (`cargo xtask bench` runs exactly that). Without `peers`, candle and the
//! GEMM ceiling are left out and the rest still runs.
//!
//! Beside the dense rows: KV-cache steps (`KvCache`, f32, bf16 and int8, with tokens per second),
//! ragged batched decoding over a `PagedKvCache` (beside `multi_head_attention` with key lengths
//! over the padded batch), bf16 attention (`attention_half`) and the backward (beside PyTorch's
//! SDPA backward). Peak heap comes from a counting allocator (`alloc.rs`).
//!
//! This crate is outside the workspace's default members, so neither `cargo test` nor
//! `cargo xtask build-content` compiles it; that is why every divan bench of the workspace lives
//! here (`benches/attention.rs` for the engine, `benches/pipeline.rs` for the course build,
//! `benches/figures.rs` for `qkv-plot`), and a plain `cargo test` builds neither divan nor its
//! clap. The last measured tables are in `README.md` and `results/`.

mod alloc;
mod cases;
mod chart;
mod machine;
mod measure;
mod peers;
mod python;
mod report;
mod tiles;

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::cases::{Case, Inputs};
use crate::report::Row;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// What `--help` prints.
const USAGE: &str = "\
usage: qkv-bench [--quick] [--json FILE] [--only TEXT] [--python PYTHON] | --tile-probe
  --quick          fewer and shorter runs (about 0.3 s of runs a row, not 3 s)
  --json FILE      also write the rows to FILE and a bar chart beside it (.svg, .png)
  --only TEXT      only the shapes whose label contains TEXT (\"f32 GEMM\" for the ceiling)
  --python PYTHON  time NumPy and PyTorch too, in that Python (a venv with torch installed)
  --tile-probe     only time the AMX kernels' patterns of tile instructions (see src/tiles.rs)
  -h, --help       this text";

/// What the command line asked for.
struct Options {
    quick: bool,
    json: Option<PathBuf>,
    only: Option<String>,
    python: Option<String>,
    tile_probe: bool,
}

impl Options {
    /// The options `args` give, or `None` for `--help`.
    fn parse(args: &[String]) -> anyhow::Result<Option<Options>> {
        let mut options = Options { quick: false, json: None, only: None, python: None, tile_probe: false };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value =
                |name: &str| args.next().with_context(|| format!("{name} needs a value")).cloned();
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--json" => options.json = Some(value("--json")?.into()),
                "--only" => options.only = Some(value("--only")?),
                "--python" => options.python = Some(value("--python")?),
                "--tile-probe" => options.tile_probe = true,
                "--help" | "-h" => return Ok(None),
                other => bail!("unknown argument {other:?}\n{USAGE}"),
            }
        }
        Ok(Some(options))
    }

    fn wants(&self, label: &str) -> bool {
        self.only.as_ref().is_none_or(|only| label.contains(only.as_str()))
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(options) = Options::parse(&args)? else {
        println!("{USAGE}");
        return Ok(());
    };
    if options.tile_probe {
        match tiles::measure(usize::MAX) {
            Some(figures) => {
                println!("CPU: {}; ns per tdpbf16ps, the fastest of five rounds", machine::cpu_model());
                for (label, ns) in figures {
                    println!("{ns:6.1}  {label}");
                }
            }
            None => println!("this CPU (or system) gives no AMX tiles: nothing to probe"),
        }
        return Ok(());
    }
    let threads = rayon::current_num_threads();
    println!(
        "CPU: {}; {threads} threads; f32 unless a shape says bf16; medians of several runs",
        machine::cpu_model()
    );
    println!("qkv kernels: {}", qkv::simd_report());
    // The ceiling is measured before and after the cases and the higher rate kept: it is the
    // machine's best, and another process that slows one of the two must not lower it.
    let measure_ceiling =
        || if options.wants("f32 GEMM") { peers::gemm_ceiling(options.quick) } else { None };
    let before = measure_ceiling();
    let tiles_before = tiles::products_alone();
    let cases: Vec<Case> =
        cases::all(options.quick).into_iter().filter(|c| options.wants(&c.label())).collect();
    let mut python = match &options.python {
        Some(python) => Some(PythonPeers {
            numpy: python::Server::start(python, "numpy", options.quick)?,
            torch: python::Server::start(python, "torch", options.quick)?,
        }),
        None => None,
    };
    let mut rows: Vec<Row> = Vec::new();
    for case in &cases {
        eprintln!("measuring {}", case.label());
        // `peers.py` has no ragged batches.
        let python = python.as_mut().filter(|_| !case.ragged);
        rows.extend(measure_case(case, options.quick, threads, python)?);
        if case.decodes() {
            rows.push(Row::stream(case, threads, machine::read_bandwidth(case.kv_bytes(), options.quick)));
        }
    }
    let after = measure_ceiling();
    if let (Some(before), Some(after)) = (tiles_before, tiles::products_alone()) {
        // 16384 FLOPs a product.
        println!(
            "AMX tile unit, products alone: {before:.1} ns a product before the cases ({:.2} TFLOP/s), \
             {after:.1} after ({:.2}); `--tile-probe` for the kernels' patterns",
            16.384 / before,
            16.384 / after
        );
    }
    let ceiling = match (before, after) {
        (Some(a), Some(b)) => {
            println!(
                "f32 GEMM ceiling ({}): {:.1} GFLOP/s before the cases, {:.1} after",
                a.label, a.gflops, b.gflops
            );
            Some(if a.gflops >= b.gflops { a } else { b })
        }
        _ => {
            println!(
                "f32 GEMM ceiling: not measured (left out by --only, or built without --features peers)"
            );
            None
        }
    };
    if let Some(c) = &ceiling {
        rows.push(Row::ceiling(c, threads));
    }
    println!("{}", report::table(&rows, ceiling.as_ref().map(|c| c.gflops)));
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
        let figure = chart::draw(&rows, &cases, ceiling.as_ref())?;
        for (extension, bytes) in [("svg", figure.svg.as_bytes()), ("png", figure.png.as_slice())] {
            let path = path.with_extension(extension);
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// The Python peers' servers (`--python`).
struct PythonPeers {
    numpy: python::Server,
    torch: python::Server,
}

/// Every implementation that applies to `case`, each checked against qkv's own output, and with
/// `python` NumPy's and PyTorch's rows: PyTorch on all threads takes turns with the first runner
/// (qkv on all threads), so that the two see the same spells of the machine; PyTorch on one thread
/// follows where the case is not too long.
fn measure_case(
    case: &Case,
    quick: bool,
    threads: usize,
    mut python: Option<&mut PythonPeers>,
) -> anyhow::Result<Vec<Row>> {
    let inputs = Inputs::random(case);
    let mut rows = Vec::new();
    let mut peer_rows = Vec::new();
    let mut runners = peers::runners(case, &inputs, quick)?;
    let mut expected = None;
    for (i, runner) in runners.iter_mut().enumerate() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(runner.threads.unwrap_or(threads)).build()?;
        // PyTorch's first call on the case (after an untimed one): whether it has the case, and
        // how long a call takes.
        let torch = match python.as_deref_mut() {
            Some(p) if i == 0 => {
                p.torch.times(case, threads, 1, 0.0)?.map(|(name, once)| (name, once, &mut p.torch))
            }
            _ => None,
        };
        let m = match torch {
            Some((name, once, server)) => {
                let mut peer = |runs, warm| {
                    let times = server.times(case, threads, runs, warm)?;
                    times
                        .map(|(_, seconds)| seconds)
                        .context("PyTorch's server dropped the case it had timed")
                };
                let (m, seconds) = pool.install(|| {
                    measure::paired(&mut runner.run, quick, measure::median_of(once), &mut peer)
                })?;
                peer_rows.push(Row::timed(case, &name, threads, seconds));
                m
            }
            None => pool.install(|| measure::median(&mut runner.run, quick))?,
        };
        // A peer that computes something else would make the comparison meaningless.
        match &expected {
            None => expected = Some(m.output.clone()),
            Some(want) => {
                let diff = measure::max_abs_diff(want, &m.output);
                if diff > 2e-3 {
                    bail!("{} on {}: differs from qkv by {diff:e}", runner.name, case.label());
                }
            }
        }
        rows.push(Row::new(case, &runner.name, runner.threads.unwrap_or(threads), &m));
    }
    if let Some(p) = python {
        if let Some((name, seconds)) = p.numpy.median(case, threads, quick)? {
            rows.push(Row::timed(case, &name, threads, seconds));
        }
        rows.append(&mut peer_rows);
        let one_thread = !quick && case.n_q * case.n_k <= 4096 * 4096;
        if let Some((name, seconds)) =
            one_thread.then(|| p.torch.median(case, 1, quick)).transpose()?.flatten()
        {
            rows.push(Row::timed(case, &name, 1, seconds));
        }
    }
    Ok(rows)
}
