//! The workspace's own build: what a newcomer's first `cargo test` has to compile.
//!
//! A newcomer runs `cargo xtask build-content`, then `cargo test`; the second should build only
//! the tests. What keeps it short:
//!
//! - Nothing is built twice: a test build unifies features over the dev-dependencies too, so
//!   `xtask/Cargo.toml` turns on in the lesson build the features the tests would add (the test
//!   below fails when they drift apart).
//! - The engine's generic code is compiled once: dev builds share generics, and
//!   `crates/qkv/src/instances.rs` names the entry points that more than one dev build uses.
//! - The profiles in the root `Cargo.toml`: dependencies at opt-level 2 and the engine at 1 (its
//!   tests check every path against the f64 reference on random shapes), line tables only, and
//!   test-only dependencies unoptimised.
//! - `crates/qkv-bench`, which holds every divan bench and the heavy peers, is not a default
//!   member.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Every package `cargo xtask build-content` builds, by `name version`, with its features, as
/// `cargo tree` resolves them for `args`.
fn features(args: &[&str]) -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace root");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "--locked", "--prefix", "none", "--format", "{p}|{f}"])
        .args(args)
        .current_dir(root)
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .filter_map(|line| {
            let (package, features) = line.split_once('|')?;
            // `name vX.Y.Z (path)`: the name and version name the build unit.
            let package = package.split(' ').take(2).collect::<Vec<_>>().join(" ");
            Some((package, features.trim_end_matches(" (*)").to_string()))
        })
        .collect()
}

/// A test build unifies features over the dev-dependencies too; where that changes a feature of
/// a package the lesson build uses, `cargo test` compiles that package and everything above it a
/// second time (it once cost 40 s on 2 cores: insta's `tempfile` turned on `bitflags/std`). The
/// fix is a feature turned on in the lesson build's own dependencies (`xtask/Cargo.toml`).
#[test]
fn a_test_build_reuses_what_the_lesson_build_built() {
    let lesson = features(&["-p", "xtask", "--edges", "no-dev"]);
    // The packages outside the default members, which `cargo test` does not build (the Python
    // package's PyO3 macros would turn on syn's `full` here).
    let outside = ["--exclude", "qkv-bench", "--exclude", "qkv-python"];
    let tests = features(&[&["--workspace"][..], &outside, &["--edges", "normal,build,dev"]].concat());
    let differing: Vec<String> = lesson
        .iter()
        .filter(|(package, features)| tests.get(*package) != Some(features))
        .map(|(package, features)| {
            format!("{package}: [{features}] for the lesson build, [{}] for the tests", tests[package])
        })
        .collect();
    assert!(differing.is_empty(), "features differ, so `cargo test` rebuilds:\n{}", differing.join("\n"));
}
