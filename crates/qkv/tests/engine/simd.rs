//! The SIMD level: what a call may ask for, and what `QKV_SIMD` does to a whole process (checked
//! in child processes of this test binary, since the variable is read once per process).

use std::process::Command;

use ndarray::array;
use qkv::{AttentionError, AttentionOptions, SimdLevel};

/// Runs the ignored test `name` of this binary in a child process with `QKV_SIMD=value`, and
/// fails with its output unless it passes.
fn run_child(name: &str, value: &str) {
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"])
        .env("QKV_SIMD", value)
        .output()
        .expect("the test binary runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{name} with QKV_SIMD={value}:\n{text}");
}

fn small_problem() -> (ndarray::Array2<f32>, ndarray::Array2<f32>, ndarray::Array2<f32>) {
    (array![[0.0_f32, 1.0]], array![[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], array![[2.0], [6.0], [4.0]])
}

#[test]
fn a_level_the_cpu_lacks_is_an_error_naming_both_levels() {
    let (q, k, v) = small_problem();
    let detected = SimdLevel::detected();
    let unsupported: Vec<SimdLevel> = SimdLevel::ALL.into_iter().filter(|l| !l.is_supported()).collect();
    if unsupported.is_empty() {
        println!("every SIMD level runs on this CPU: no unsupported level to ask for");
    }
    for level in unsupported {
        let err =
            qkv::attention(q.view(), k.view(), v.view(), &AttentionOptions::new().simd(level)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "AttentionOptions::simd asks for the {level} SIMD level, which this CPU does not run (the best \
                 it runs is {detected}): ask for {detected} or a lower level, or leave the choice to the engine"
            )
        );
    }
    // Every level it has gives the same answer, to rounding.
    for level in SimdLevel::ALL.into_iter().filter(|l| l.is_supported()) {
        let out = qkv::attention(q.view(), k.view(), v.view(), &AttentionOptions::new().simd(level)).unwrap();
        assert!((out[[0, 0]] - 4.4067).abs() < 1e-4, "{level}: {out}");
    }
}

#[test]
fn levels_parse_from_their_names_only() {
    for level in SimdLevel::ALL {
        assert_eq!(level.name().parse::<SimdLevel>(), Ok(level));
        // As an environment variable may hold it.
        assert_eq!(format!(" {} ", level.name().to_uppercase()).parse::<SimdLevel>(), Ok(level));
    }
    assert_eq!(
        "avx-512".parse::<SimdLevel>(),
        Err(AttentionError::UnknownSimdLevel { value: "avx-512".into() })
    );
    assert!(SimdLevel::Baseline.is_supported(), "the baseline runs everywhere");
}

#[test]
fn qkv_simd_forces_a_lower_level() {
    run_child("simd::child_forced_baseline", "baseline");
}

#[test]
#[ignore = "run by qkv_simd_forces_a_lower_level with QKV_SIMD=baseline"]
fn child_forced_baseline() {
    assert_eq!(SimdLevel::dispatched(), Ok(SimdLevel::Baseline));
    let report = qkv::simd_report();
    let detected = SimdLevel::detected();
    assert_eq!(report, format!("baseline (SSE2), forced by QKV_SIMD=baseline; this CPU runs {detected}"));
    let (q, k, v) = small_problem();
    let out = qkv::attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap();
    assert!((out[[0, 0]] - 4.4067).abs() < 1e-4);
}

#[test]
fn qkv_simd_with_a_bad_name_fails_every_call_clearly() {
    run_child("simd::child_bad_name", "sse9");
}

#[test]
#[ignore = "run by qkv_simd_with_a_bad_name_fails_every_call_clearly with QKV_SIMD=sse9"]
fn child_bad_name() {
    let expected = "\"sse9\" is not a SIMD level: QKV_SIMD takes amx, avx512bf16, avx512, avx2 or baseline";
    assert_eq!(SimdLevel::dispatched().unwrap_err().to_string(), expected);
    assert_eq!(qkv::simd_report(), format!("no level: {expected}"));
    let (q, k, v) = small_problem();
    let err = qkv::attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap_err();
    assert_eq!(err.to_string(), expected);
    // A call that names its own level does not depend on the variable.
    let own = AttentionOptions::new().simd(SimdLevel::Baseline);
    assert!(qkv::attention(q.view(), k.view(), v.view(), &own).is_ok());
}

#[test]
fn qkv_simd_above_the_cpu_fails_every_call_clearly() {
    match SimdLevel::ALL.into_iter().find(|l| !l.is_supported()) {
        Some(level) => run_child("simd::child_above_the_cpu", level.name()),
        None => println!("every SIMD level runs on this CPU: no level above it to force"),
    }
}

#[test]
#[ignore = "run by qkv_simd_above_the_cpu_fails_every_call_clearly with QKV_SIMD set to a level the CPU lacks"]
fn child_above_the_cpu() {
    let requested: SimdLevel = std::env::var("QKV_SIMD").unwrap().parse().unwrap();
    let detected = SimdLevel::detected();
    let expected = format!(
        "QKV_SIMD asks for the {requested} SIMD level, which this CPU does not run (the best it runs is \
         {detected}): ask for {detected} or a lower level, or leave the choice to the engine"
    );
    let (q, k, v) = small_problem();
    let err = qkv::attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap_err();
    assert_eq!(err.to_string(), expected);
    assert_eq!(qkv::simd_report(), format!("no level: {expected}"));
}

#[test]
fn the_report_names_the_dispatched_level() {
    // Unless the environment forces a level (then the child tests above cover the report).
    if std::env::var_os("QKV_SIMD").is_some() {
        println!("QKV_SIMD is set: the report is checked by the child tests");
        return;
    }
    // The best level this CPU runs, or one below it where that one is slower on this CPU.
    let detected = SimdLevel::detected();
    let dispatched = SimdLevel::dispatched().unwrap();
    assert!(dispatched <= detected && dispatched.is_supported(), "{dispatched} against {detected}");
    let why = if dispatched == detected {
        "the best this CPU runs".to_string()
    } else {
        format!("the fastest this CPU runs ({detected} is slower here)")
    };
    assert_eq!(qkv::simd_report(), format!("{dispatched} ({}), {why}", dispatched.instructions()));
}
