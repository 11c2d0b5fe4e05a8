//! `cargo xtask attend`, the authors' calculator: the lesson's numbers, bad arguments, and
//! `.npy` files against a NumPy float64 computation.

use std::process::Command;

use ndarray::Array2;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::support::{numpy_available, xtask};

const LESSON: [&str; 6] = ["--keys", "1,0; 0,1; 1,1", "--values", "2; 6; 4", "--queries", "0,1; 1,0"];

#[test]
fn reproduces_the_lesson_numbers_as_json() {
    let run = xtask(&[&["attend", "--json"], &LESSON[..]].concat());
    assert_eq!(run.status, 0, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let row = |name: &str, i: usize| -> Vec<String> {
        doc[name][i].as_array().unwrap().iter().map(|x| format!("{:.4}", x.as_f64().unwrap())).collect()
    };
    assert_eq!(row("scores", 0), ["0.0000", "0.7071", "0.7071"]);
    assert_eq!(row("weights", 0), ["0.1978", "0.4011", "0.4011"]);
    assert_eq!(row("output", 0), ["4.4067"]);
    assert_eq!(row("output", 1), ["3.5933"]);
}

#[test]
fn steps_print_every_intermediate() {
    let run =
        xtask(&["attend", "--steps", "--query", "0,1", "--keys", "1,0; 0,1; 1,1", "--values", "2; 6; 4"]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    for expected in ["0.0000, 0.7071, 0.7071", "-0.7071, 0.0000, 0.0000", "0.4931, 1.0000, 1.0000", "2.4931"]
    {
        assert!(run.stdout.contains(expected), "missing {expected} in\n{}", run.stdout);
    }
    assert!(run.stdout.contains("(4.4067)"), "{}", run.stdout);
}

#[test]
fn causal_json_marks_hidden_scores_null() {
    let run = xtask(&[
        "attend",
        "--json",
        "--causal",
        "--queries",
        "1,0; 0,1",
        "--keys",
        "1,0; 0,1",
        "--values",
        "1; 2",
    ]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["scores"][0][1], Value::Null);
    assert_eq!(doc["weights"][0], serde_json::json!([1.0, 0.0]));
}

#[test]
fn malformed_arguments_exit_2_naming_the_text() {
    for (args, expected) in [
        (
            vec!["attend", "--query", "0,1", "--keys", "1,0; 0,x", "--values", "2; 6"],
            "--keys \"1,0; 0,x\": `x` is not a finite number",
        ),
        (
            vec!["attend", "--query", "0,1", "--keys", "1,0; 0", "--values", "2; 6"],
            "row 1 has 1 components but row 0 has 2",
        ),
        (
            vec!["attend", "--query", "0,1", "--keys", "2; 6; 4", "--values", "2; 6; 4"],
            "keys have width 1 but queries have width 2",
        ),
        (
            vec!["attend", "--query", "0,1", "--keys", "1,0", "--values", "2", "--precision", "f16"],
            "expected f32 or f64",
        ),
        (
            vec!["attend", "--query", "0,1", "--keys", "1,0", "--values", "2", "--bogus"],
            "unexpected argument `--bogus`",
        ),
        (vec!["attend", "--q", "/nonexistent.npy", "--k", "k.npy", "--v", "v.npy"], "--q /nonexistent.npy"),
    ] {
        let run = xtask(&args);
        assert_eq!(run.status, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(expected), "{args:?}: expected `{expected}` in {}", run.stderr);
    }
}

/// Random `.npy` problems through the calculator, checked against NumPy in float64.
#[test]
fn npy_files_agree_with_numpy_float64() {
    if !numpy_available("npy_files_agree_with_numpy_float64") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    for (case, (n_q, n_k, d_k, d_v)) in
        [(1, 1, 1, 1), (5, 7, 3, 2), (33, 65, 16, 8), (130, 129, 64, 80)].into_iter().enumerate()
    {
        let mut m = |r, c| Array2::from_shape_simple_fn((r, c), || rng.random_range(-2.0..2.0));
        let (q, k, v): (Array2<f64>, Array2<f64>, Array2<f64>) = (m(n_q, d_k), m(n_k, d_k), m(n_k, d_v));
        for precision in ["f64", "f32"] {
            let path = |name: &str| dir.path().join(format!("{case}-{precision}-{name}.npy"));
            if precision == "f64" {
                for (name, a) in [("q", &q), ("k", &k), ("v", &v)] {
                    ndarray_npy::write_npy(path(name), a).unwrap();
                }
            } else {
                for (name, a) in [("q", &q), ("k", &k), ("v", &v)] {
                    ndarray_npy::write_npy(path(name), &a.mapv(|x| x as f32)).unwrap();
                }
            }
            let [qp, kp, vp, op] = ["q", "k", "v", "o"].map(|n| path(n).display().to_string());
            let run = xtask(&["attend", "--q", &qp, "--k", &kp, "--v", &vp, "--out", &op]);
            assert_eq!(run.status, 0, "{}", run.stderr);
            let numpy_type = if precision == "f64" { "float64" } else { "float32" };
            // NumPy computes in float64 from the same files (f32 inputs widened exactly).
            let script = format!(
                "import numpy as np\n\
                 q, k, v, o = (np.load(p) for p in {:?})\n\
                 assert o.dtype == np.dtype('{numpy_type}'), o.dtype\n\
                 q, k, v = (a.astype(np.float64) for a in (q, k, v))\n\
                 s = q @ k.T / np.sqrt(q.shape[1])\n\
                 p = np.exp(s - s.max(axis=1, keepdims=True)); p /= p.sum(axis=1, keepdims=True)\n\
                 want = p @ v\n\
                 err = np.abs(o.astype(np.float64) - want) / (1 + np.abs(want))\n\
                 print(err.max())",
                [&qp, &kp, &vp, &op]
            );
            let out = Command::new("python3").args(["-c", &script]).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let err: f64 = String::from_utf8(out.stdout).unwrap().trim().parse().unwrap();
            let tol = if precision == "f64" { 1e-12 } else { 1e-5 };
            eprintln!("case {case} [{n_q}, {n_k}, {d_k}, {d_v}] {precision}: max relative error {err:e}");
            assert!(err <= tol, "case {case} {precision}: relative error {err} > {tol}");
        }
    }
}

/// Issue 11, finding 8: `cargo xtask attend … | head -1` exited 101 with "failed printing to
/// stdout: Broken pipe". Far more output than a pipe holds, and a reader that stops after one line.
#[test]
fn a_closed_pipe_ends_the_calculator_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let queries = vec!["1,0"; 4000].join("; ");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["attend", "--steps", "--queries", &queries, "--keys", "1,0; 0,1", "--values", "1; 2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xtask runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("one line");
    assert!(first.starts_with("query 0 = "), "{first}");
    // The reader is gone now; the next write fails with EPIPE.
    let out = child.wait_with_output().expect("xtask ends");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}
