//! qkv command line: `cargo xtask <command> [args]`, one module per command.

mod bench;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    match command.as_str() {
        "bench" => bench::run(args),
        other => anyhow::bail!("unknown command {other:?}: expected one of: bench"),
    }
}
