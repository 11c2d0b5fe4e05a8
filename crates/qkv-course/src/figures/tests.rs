use super::*;

#[test]
fn raw_variance_grows_like_d_k_and_scaled_stays_near_one() {
    let pair = montecarlo::variance(7, 4000, &[1, 16, 256]);
    for (i, d) in [1.0, 16.0, 256.0].into_iter().enumerate() {
        assert!((pair.raw[i] / d - 1.0).abs() < 0.15, "Var(q·k) at d_k = {d}: {}", pair.raw[i]);
        assert!((pair.scaled[i] - 1.0).abs() < 0.15, "scaled variance at d_k = {d}: {}", pair.scaled[i]);
    }
}

#[test]
fn unscaled_softmax_saturates_and_scaled_does_not() {
    let pair = montecarlo::saturation(7, 2000, &[1, 256]).expect("valid shapes");
    assert!(pair.raw[1] > 0.9, "raw scores at d_k = 256: {}", pair.raw[1]);
    assert!(pair.scaled[1] < 0.6, "scaled scores at d_k = 256: {}", pair.scaled[1]);
}

#[test]
fn monte_carlo_is_deterministic() {
    assert_eq!(montecarlo::variance(3, 100, &[4]), montecarlo::variance(3, 100, &[4]));
}

#[test]
fn kinds_round_trip_through_their_names() {
    for name in FigureKind::NAMES {
        let kind = FigureKind::from_name(name).expect("known");
        assert_eq!(kind.name(), *name);
    }
    assert_eq!(FigureKind::from_name("histogram"), None);
}

#[test]
fn hashes_ignore_last_bit_differences() {
    assert_eq!(
        canonical_numbers("w: [0.4011120926797859, 1.0], n: 3, x1: 2.5e-7"),
        "w: [4.01112093e-1, 1.00000000e0], n: 3, x1: 2.50000000e-7"
    );
    assert_eq!(hash_of("weights [0.4011120926797859]"), hash_of("weights [0.40111209267978593]"));
    assert_ne!(hash_of("weights [0.4011]"), hash_of("weights [0.4012]"));
}
