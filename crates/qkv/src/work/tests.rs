//! Shared work comes back in item order, whoever took each item.

use super::*;

#[test]
fn results_come_back_in_item_order_on_any_pool() {
    for threads in [1, 2, 3, 5] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for share in [false, true] {
            let items: Vec<usize> = (0..97).collect();
            // Uneven item costs, so that threads finish out of order.
            let got = pool.install(|| {
                map_items(
                    items,
                    share,
                    || (),
                    |_, i| {
                        std::thread::sleep(Duration::from_micros((i % 5) as u64 * 50));
                        i * i
                    },
                )
            });
            assert_eq!(got, (0..97).map(|i| i * i).collect::<Vec<_>>(), "{threads} threads, share {share}");
        }
    }
    // From outside any pool, too (the calling thread takes items beside the global pool's).
    assert_eq!(map_items(vec![3, 1, 2], true, || (), |_, i| i + 1), vec![4, 2, 3]);
    assert!(map_items(Vec::<u8>::new(), true, || (), |_, i| i).is_empty());
}

#[test]
fn a_thread_with_no_item_left_waits_for_the_others_up_to_a_bound() {
    let progress = Progress::new(3, true);
    assert_eq!([progress.take(), progress.take(), progress.take()], [Some(0), Some(1), Some(2)]);
    assert_eq!(progress.take(), None);
    progress.finished_one();
    progress.finished_one();
    // An item that never finishes (its thread panicked) holds the others up only so long.
    let start = Instant::now();
    progress.wait_for_the_rest();
    let waited = start.elapsed();
    assert!(waited >= WAIT_FOR_THE_REST && waited < Duration::from_secs(1), "{waited:?}");
    // With every item done there is nothing to wait for: a thousand waits take less than half of
    // one bound's wait each.
    progress.finished_one();
    let start = Instant::now();
    (0..1000).for_each(|_| progress.wait_for_the_rest());
    assert!(start.elapsed() < WAIT_FOR_THE_REST * 500, "{:?}", start.elapsed());
    // Nor where the call's threads do not wait, with an item still out.
    let progress = Progress::new(2, false);
    (0..2).for_each(|_| assert!(progress.take().is_some()));
    progress.finished_one();
    let start = Instant::now();
    (0..1000).for_each(|_| progress.wait_for_the_rest());
    assert!(start.elapsed() < WAIT_FOR_THE_REST * 500, "{:?}", start.elapsed());
}

#[test]
fn a_panicking_item_reaches_the_caller_from_a_shared_call() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let items: Vec<usize> = (0..8).collect();
    let call =
        || pool.install(|| map_items(items, true, || (), |_, i| if i == 3 { panic!("item 3") } else { i }));
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).is_err());
}

#[test]
fn a_call_follows_closely_only_within_the_back_to_back_window() {
    let window = BACK_TO_BACK_US * 1000;
    assert!(!follows_closely(0, 5), "no call yet");
    assert!(follows_closely(1_000, 1_000));
    assert!(follows_closely(1_000, 1_000 + window - 1));
    assert!(!follows_closely(1_000, 1_000 + window));
    assert!(follows_closely(2_000, 1_000), "another thread's call ended after `now` was read");
    // Large work is always shared, work below the back-to-back threshold never; while helpers
    // are kept waiting, only work that outlasts the last one's wait.
    let late = Some(5_000.0);
    for back_to_back in [false, true] {
        assert!(shares(SHARE_ABOVE_US, None, back_to_back));
        assert!(!shares(SHARE_BACK_TO_BACK_ABOVE_US / 2.0, None, back_to_back));
        assert!(!shares(4_999.0, late, back_to_back));
        assert!(shares(5_000.0, late, back_to_back));
    }
    assert!(shares(SHARE_BACK_TO_BACK_ABOVE_US, None, true));
    assert!(!shares(SHARE_BACK_TO_BACK_ABOVE_US, None, false));
    // A call's end is stamped with a time no later than now.
    drop(CallEnd);
    let last = LAST_END_NS.load(Ordering::Relaxed);
    assert!(last != 0 && last <= since_start());
}

#[test]
fn the_threshold_override_parses_whole_numbers_only() {
    assert_eq!(parse_whole_number("0"), 0);
    assert_eq!(parse_whole_number("200"), 200);
    assert!(std::panic::catch_unwind(|| parse_whole_number("2e6")).is_err());
}

#[test]
fn each_thread_makes_one_scratch_and_keeps_it() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let made = AtomicUsize::new(0);
    let new_scratch = || {
        made.fetch_add(1, Ordering::Relaxed);
        0_usize
    };
    // Each result is how many items its thread's scratch served before it.
    let served = pool.install(|| {
        map_items((0..50).collect(), true, new_scratch, |seen: &mut usize, _: usize| {
            std::thread::sleep(Duration::from_micros(100));
            *seen += 1;
            *seen - 1
        })
    });
    let made = made.load(Ordering::Relaxed);
    assert!((1..=2).contains(&made), "{made} scratches for 2 threads");
    // Every scratch counts from 0 up without gaps: `made` zeros, and 50 items in all.
    assert_eq!(served.iter().filter(|&&s| s == 0).count(), made);
}

#[test]
fn a_helper_that_starts_late_keeps_small_work_on_the_calling_thread() {
    let hand_out = HandOut { caller: std::thread::spawn(Caller::here).join().unwrap(), at_ns: since_start() };
    std::thread::sleep(Duration::from_millis(2));
    // Five in a row open a window of 80 ms, unless another test's prompt helper came between.
    for _ in 0..5 {
        hand_out.arrive();
    }
    assert!(kept_waiting_us(since_start()).is_some(), "a helper 2 ms late");
    assert!(!worth_sharing(SHARE_ABOVE_US * TILED_FLOPS_PER_US_PER_LANE * 16.0, false, 16));
    assert!(!worth_sharing_a_pass());
}
