//! qkv's command line: `build-content`, `serve`, `attend`, `bench`, `fuzz`. The only code in the
//! workspace that reads or writes the lesson (`content/`) and the site; the engine, `qkv-plot` and
//! `qkv-course` take and return strings and bytes. Each subcommand lives in its own module, over
//! `lesson.rs` (the lesson on disk, written all or nothing) and `cli.rs` (arguments, output to a
//! closed pipe, where the workspace is).

mod attend;
mod bench;
mod build_content;
mod cli;
mod fuzz;
mod lesson;
mod serve;

use std::process::ExitCode;

use cli::UsageError;

const HELP: &str = "\
usage: cargo xtask <command> [options]

commands:
  build-content [--check] [--out DIR] [--content DIR]
                                        recompute the lesson under content/ and write the site
                                        (default target/site); --check writes nothing
  serve [--port N] [--content DIR] [--out DIR]
                                        preview the site on http://127.0.0.1:N/ (default 3000,
                                        0 for any free port), rebuilt and reloaded on every change
  attend [options]                      the authors' calculator: attention on numbers you give it
  bench [--quick] [--json FILE] [--only TEXT] [--python PYTHON] | bench --tile-probe
                                        benchmark qkv against its peers (release build)
  fuzz [--minutes N] [--seed S] [--replay DIR]
                                        mutate the lesson and check the build's promises on
                                        each mutant; failing ones are saved under target/fuzz/

`cargo xtask attend --help` lists the calculator's options.";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next();
    let rest: Vec<String> = args.collect();
    let result = match command.as_deref() {
        Some("attend") => attend::run(rest),
        Some("build-content") => build_content::run(rest),
        Some("serve") => serve::run(rest),
        Some("bench") => bench::run(rest),
        Some("fuzz") => fuzz::run(rest),
        Some("help" | "--help" | "-h") => cli::write_line(format_args!("{HELP}")).map_err(Into::into),
        Some(other) => cli::usage(format!("unknown command `{other}`\n\n{HELP}")),
        None => cli::usage(HELP),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`| head -1`): nothing is wrong, and nothing to say.
        Err(e) if cli::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(if e.is::<UsageError>() { 2 } else { 1 })
        }
    }
}
