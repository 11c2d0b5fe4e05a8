//! qkv's benchmark: times the fast path (all threads and one), the f64 reference, the unfused
//! peers and the machine's f32 GEMM rate on the shapes, and prints one table.
//!
//! `cargo run --release -p qkv-bench --features peers -- [--quick] [--json FILE] [--only TEXT]`
//! (`cargo xtask bench` runs exactly that). Without `peers`, candle and the GEMM ceiling are
//! left out and the rest still runs.

mod alloc;
mod cases;
mod measure;
mod peers;
mod report;

use anyhow::{Context, bail};

use crate::cases::{Case, Inputs};
use crate::report::Row;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// What the command line asked for.
struct Options {
    quick: bool,
    json: Option<std::path::PathBuf>,
    only: Option<String>,
}

impl Options {
    fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut options = Options { quick: false, json: None, only: None };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--json" => options.json = Some(args.next().context("--json needs a file name")?.into()),
                "--only" => options.only = Some(args.next().context("--only needs a text")?.clone()),
                other => bail!("unknown argument {other:?}: expected --quick, --json FILE or --only TEXT"),
            }
        }
        Ok(options)
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = Options::parse(&args)?;
    let threads = rayon::current_num_threads();
    println!("qkv {}; {threads} threads; f32; medians of several runs", qkv::simd_report());
    let wanted = |label: &str| options.only.as_ref().is_none_or(|only| label.contains(only.as_str()));
    let ceiling = if wanted("f32 GEMM") { peers::gemm_ceiling(options.quick) } else { None };
    match &ceiling {
        Some(c) => println!("f32 GEMM ceiling ({}): {:.1} GFLOP/s", c.label, c.gflops),
        None => {
            println!("f32 GEMM ceiling: not measured (left out by --only, or built without --features peers)")
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    for case in cases::all(options.quick) {
        if !wanted(&case.label()) {
            continue;
        }
        eprintln!("measuring {}", case.label());
        rows.extend(measure_case(&case, options.quick, threads)?);
    }
    if let Some(c) = &ceiling {
        rows.push(Row::ceiling(c, threads));
    }
    println!("{}", report::table(&rows, ceiling.as_ref().map(|c| c.gflops)));
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Every implementation that applies to `case`, each checked against qkv's own output.
fn measure_case(case: &Case, quick: bool, threads: usize) -> anyhow::Result<Vec<Row>> {
    let inputs = Inputs::random(case);
    let mut rows = Vec::new();
    let mut runners = peers::runners(case, &inputs, quick)?;
    let mut expected = None;
    for runner in &mut runners {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(runner.threads.unwrap_or(threads)).build()?;
        let m = pool.install(|| measure::median(&mut runner.run, case.flops(), quick))?;
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
    Ok(rows)
}
