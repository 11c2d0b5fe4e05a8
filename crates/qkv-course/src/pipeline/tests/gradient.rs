//! The fixture's gradient blocks against independent computations: central finite differences
//! of the loss (through the engine's reference forward) for every gradient, the engine's fast
//! tiled backward on its own saved logsumexp, and a step taken here by hand.

use ndarray::{Array2, Array4, Axis};

use super::{EVERY_KIND, one_file, values_of};

/// The fixture's four-token example: queries, keys, values.
fn four() -> [Array2<f64>; 3] {
    let m = |rows: &[[f64; 2]]| Array2::from_shape_vec((rows.len(), 2), rows.concat()).expect("4 x 2");
    let q = m(&[[1., 0.], [0., 1.], [1., 1.], [2., 1.]]);
    let k = m(&[[1., 0.], [0., 1.], [1., 1.], [1., -1.]]);
    let v = Array2::from_shape_vec((4, 1), vec![2., 6., 4., 8.]).expect("4 x 1");
    [q, k, v]
}

/// `½ Σ (O − target)²` of the engine's reference forward.
fn loss(qkv: &[Array2<f64>; 3], target: &Array2<f64>, options: &qkv::AttentionOptions<f64>) -> f64 {
    let o = qkv::reference::attention(qkv[0].view(), qkv[1].view(), qkv[2].view(), options)
        .expect("forward")
        .output;
    0.5 * (&o - target).mapv(|x| x * x).sum()
}

#[test]
fn gradients_equal_finite_differences_and_the_engine_s_fast_backward() {
    let values = values_of(&one_file(EVERY_KIND));
    let get = |path: &str| *values.get(&format!("test.{path}")).unwrap_or_else(|| panic!("no {path}"));
    let tokens = ["a", "b", "c", "d"];
    let slopes = [0.5];
    let cases = [("g_alibi", [1., 5., 3., 6.], 0.1, true), ("g_four", [3., 5., 4., 7.], 0.5, false)];
    for (id, target, rate, masked) in cases {
        let target = Array2::from_shape_vec((4, 1), target.to_vec()).expect("target");
        let mut options = qkv::AttentionOptions::new();
        if masked {
            options = options.causal(qkv::CausalMask::BottomRight).alibi(qkv::Alibi::new(&slopes));
        }
        let inputs = four();
        let base = loss(&inputs, &target, &options);
        assert!((get(&format!("{id}.loss")) - base).abs() < 1e-12, "{id} loss");
        // Every gradient against the central difference of the loss.
        let h = 1e-6;
        let mut by_hand = inputs.clone();
        for (x, name) in ["d_queries", "d_keys", "d_values"].iter().enumerate() {
            for ((row, col), _) in inputs[x].indexed_iter() {
                let nudged = |by: f64| {
                    let mut moved = inputs.clone();
                    moved[x][[row, col]] += by;
                    loss(&moved, &target, &options)
                };
                let numeric = (nudged(h) - nudged(-h)) / (2.0 * h);
                let ours = get(&format!("{id}.{name}.{}.{}", tokens[row], col + 1));
                assert!((ours - numeric).abs() < 1e-6, "{id} {name} {row},{col}: {ours} vs {numeric}");
                by_hand[x][[row, col]] -= rate * ours;
            }
        }
        // One step by hand lowers the loss to what the block says.
        let after = loss(&by_hand, &target, &options);
        assert!((get(&format!("{id}.steps.1.loss")) - after).abs() < 1e-12, "{id} step");
        assert!(after < base, "{id}: a step raised the loss from {base} to {after}");
        let stepped =
            qkv::reference::attention(by_hand[0].view(), by_hand[1].view(), by_hand[2].view(), &options)
                .expect("forward");
        for ((i, j), &w) in stepped.weights.indexed_iter() {
            let ours = get(&format!("{id}.steps.1.weights.{}.{}", tokens[i], tokens[j]));
            assert!((ours - w).abs() < 1e-12, "{id} weight {i},{j} after a step: {ours} vs {w}");
        }
        // The engine's fast backward, one batch of one head, from its own saved logsumexp.
        let four_d = |a: &Array2<f64>| a.clone().insert_axis(Axis(0)).insert_axis(Axis(0));
        let (q, k, v): (Array4<f64>, Array4<f64>, Array4<f64>) =
            (four_d(&inputs[0]), four_d(&inputs[1]), four_d(&inputs[2]));
        let forward =
            qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options).expect("forward");
        let d_out = &forward.output - &four_d(&target);
        let fast = qkv::multi_head_attention_backward(
            q.view(),
            k.view(),
            v.view(),
            &forward,
            d_out.view(),
            &options,
        )
        .expect("backward");
        for (name, g) in [("d_queries", &fast.dq), ("d_keys", &fast.dk), ("d_values", &fast.dv)] {
            for ((_, _, row, col), &x) in g.indexed_iter() {
                let ours = get(&format!("{id}.{name}.{}.{}", tokens[row], col + 1));
                assert!((ours - x).abs() < 1e-9, "{id} fast {name} {row},{col}: {ours} vs {x}");
            }
        }
        // The saved logsumexp gives each weight back: p = exp(s - lse).
        for (i, t) in tokens.iter().enumerate() {
            let lse = get(&format!("{id}.lse.{t}"));
            assert!((forward.logsumexp[[0, 0, i]] - lse).abs() < 1e-9, "{id} lse {t}");
        }
    }
    // The row worked by hand (δ = do · o, dS) agrees with the reference's gradients: the query of
    // "d" is the scale times Σ_j dS_j k_j.
    let [_, k, _] = four();
    for c in 0..2 {
        let by_rows: f64 =
            tokens.iter().enumerate().map(|(j, t)| get(&format!("g_alibi.d.ds.{t}")) * k[[j, c]]).sum();
        let reference = get(&format!("g_alibi.d_queries.d.{}", c + 1));
        assert!((by_rows / 2f64.sqrt() - reference).abs() < 1e-12, "row by hand, column {c}");
    }
}

/// A query labelled like one of the block's own fields would be shadowed in paths: an error at
/// the block's `example`, with its position.
#[test]
fn a_token_named_like_a_gradient_field_is_an_error_at_the_example() {
    let lesson = "# T\n\n```qkv attention\nid = \"ex\"\ntokens = [\"loss\", \"b\"]\nqueries = [[1], [0]]\nkeys = [[1], [0]]\nvalues = [[1], [2]]\n```\n\n```qkv gradient\nid = \"g\"\nexample = \"ex\"\ntarget = [[0], [0]]\nlearning_rate = 0.1\n```\n";
    let error = match super::check(&one_file(lesson)) {
        Ok(_) => panic!("the lesson built"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("content/01-test.md:13:12: token `loss` of `ex` is also the name"), "{error}");
}

/// The training section's claims in words ("down from", "the loss falls", "up from") follow its
/// inputs: a learning rate of 2 makes the loss rise, and the build stops at each claim it breaks,
/// naming its place and both numbers, instead of writing prose that says the opposite.
#[test]
fn a_learning_rate_that_raises_the_loss_breaks_the_training_section_s_claims() {
    let mut sources = super::lesson();
    let training = sources
        .markdown
        .iter_mut()
        .find(|f| f.path.ends_with("-training-attention.md"))
        .expect("the training section");
    assert_eq!(training.text.matches("learning_rate = 0.25").count(), 1);
    training.text = training.text.replacen("learning_rate = 0.25", "learning_rate = 2", 1);
    let report = match crate::pipeline::check(&sources) {
        Ok(stale) => panic!("expected the claims to fail, got {} stale places", stale.len()),
        Err(e) => e.to_string(),
    };
    // Every claim of the section breaks ("down from", "the loss falls", the output of "love"
    // climbing, "up from"), each at its own place, and nothing else does.
    let claims = [
        "`train.loss_after < train.loss` is false",
        "`train.steps.4.loss < train.loss` is false",
        "`train.steps.4.output.love.1 > train.output.love.1` is false",
        "`train.steps.4.weights.love.love > attention.sentence.love.weights.love` is false",
    ];
    for claim in claims {
        let line =
            report.lines().find(|l| l.contains(claim)).unwrap_or_else(|| panic!("{claim} in {report}"));
        assert!(line.starts_with("content/09-training-attention.md:"), "{line}");
        assert!(line.contains("a claim of the prose no longer holds"), "{line}");
    }
    assert!(report.ends_with("4 errors in the lesson source; nothing was written"), "{report}");
}
