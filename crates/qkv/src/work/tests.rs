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
    // A call on another library's threads is held back by what that team's threads saw, not by
    // what rayon's helpers saw.
    assert!(std::ptr::eq(contention(), &CONTENTION));
    let team = std::sync::Arc::new(Spawned { threads: 2, returned: AtomicUsize::new(0) });
    with_thread_team(team, || assert!(std::ptr::eq(contention(), &TEAM_CONTENTION)));
}

/// A team whose other threads start `late` after the call, as a team's threads do whose CPU
/// another program keeps busy.
struct Late {
    late: Duration,
}

impl ThreadTeam for Late {
    fn threads(&self) -> usize {
        2
    }

    fn run(&self, _threads: usize, work: &(dyn Fn() + Sync)) {
        std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(self.late);
                work();
            });
            work();
        });
    }
}

#[test]
fn a_teams_late_thread_keeps_small_work_on_the_calling_thread() {
    let late = std::sync::Arc::new(Late { late: Duration::from_millis(3) });
    with_thread_team(late, || {
        // Five in a row open a window of 80 ms, unless another test's prompt team came between.
        for _ in 0..5 {
            map_items(vec![0, 1], true, || (), |_, i: usize| i);
        }
        // At least the threshold: another test's team may have noted a start late by less since.
        let kept = kept_waiting_us(since_start()).expect("a team thread 3 ms late");
        assert!(kept >= 1000.0, "noted {kept} µs");
        assert!(!worth_sharing(SHARE_ABOVE_US * TILED_FLOPS_PER_US_PER_LANE * 16.0, false, 16));
        assert!(!worth_sharing_a_pass());
        // Work that outlasts the wait is still shared.
        assert!(worth_sharing(2.0 * kept * TILED_FLOPS_PER_US_PER_LANE * 16.0, false, 16));
    });
}

/// A team of threads spawned for each call, which notes whether its `run` returned.
struct Spawned {
    threads: usize,
    returned: AtomicUsize,
}

impl ThreadTeam for Spawned {
    fn threads(&self) -> usize {
        self.threads
    }

    fn run(&self, threads: usize, work: &(dyn Fn() + Sync)) {
        std::thread::scope(|scope| {
            for _ in 1..threads {
                scope.spawn(work);
            }
            work();
        });
        self.returned.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn a_team_takes_the_items_in_place_of_the_pool() {
    let team = std::sync::Arc::new(Spawned { threads: 3, returned: AtomicUsize::new(0) });
    // Each result: the item's square, and whether a rayon thread computed it.
    let got = with_thread_team(team.clone(), || {
        assert_eq!(threads(), 3);
        map_items(
            (0..40).collect(),
            true,
            || (),
            |_, i: usize| {
                std::thread::sleep(Duration::from_micros(200));
                (i * i, std::thread::current().id(), rayon::current_thread_index().is_some())
            },
        )
    });
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), (0..40).map(|i| i * i).collect::<Vec<_>>());
    assert!(got.iter().all(|r| !r.2), "a rayon thread took an item");
    let ids: std::collections::HashSet<_> = got.iter().map(|r| r.1).collect();
    assert!(ids.len() > 1 && ids.len() <= 3, "{} threads took the items", ids.len());
    assert_eq!(team.returned.load(Ordering::Relaxed), 1);
    // Outside the closure the pool is back.
    assert_eq!(threads(), rayon::current_num_threads());

    // Indices too, each thread with a scratch of its own.
    let mut scratches: Vec<Mutex<Vec<usize>>> = Vec::new();
    let done: Vec<AtomicUsize> = (0..30).map(|_| AtomicUsize::new(0)).collect();
    with_thread_team(team.clone(), || {
        for_each_index(
            30,
            true,
            &mut scratches,
            |_| {},
            |taken: &mut Vec<usize>, i| {
                std::thread::sleep(Duration::from_micros(200));
                taken.push(i);
                done[i].fetch_add(1, Ordering::Relaxed);
            },
        )
    });
    assert!(done.iter().all(|d| d.load(Ordering::Relaxed) == 1), "each index once");
    let taken: Vec<usize> = scratches.iter_mut().map(|s| s.get_mut().unwrap().len()).collect();
    assert_eq!(taken.iter().sum::<usize>(), 30);
    assert!(taken.iter().filter(|&&n| n > 0).count() > 1, "one scratch took every index: {taken:?}");
    assert_eq!(team.returned.load(Ordering::Relaxed), 2);
}

#[test]
fn a_panic_on_a_teams_thread_reaches_the_caller_and_not_the_teams_code() {
    let team = std::sync::Arc::new(Spawned { threads: 2, returned: AtomicUsize::new(0) });
    let call = || {
        with_thread_team(team.clone(), || {
            map_items((0..8).collect(), true, || (), |_, i: usize| if i == 3 { panic!("item 3") } else { i })
        })
    };
    let payload = std::panic::catch_unwind(call).expect_err("item 3 panics");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"item 3"));
    // The team's `run` returned: the panic did not unwind through it.
    assert_eq!(team.returned.load(Ordering::Relaxed), 1);
    // And the team is gone from this thread once the call unwound.
    assert!(!team::active());
}

#[test]
fn the_innermost_team_holds_and_the_outer_one_comes_back() {
    let outer = std::sync::Arc::new(Spawned { threads: 2, returned: AtomicUsize::new(0) });
    let inner = std::sync::Arc::new(Spawned { threads: 5, returned: AtomicUsize::new(0) });
    with_thread_team(outer, || {
        assert_eq!(threads(), 2);
        let unwound = std::panic::catch_unwind(|| {
            with_thread_team(inner, || {
                assert_eq!(threads(), 5);
                panic!("inside")
            })
        });
        assert!(unwound.is_err());
        assert_eq!(threads(), 2);
    });
    assert!(!team::active());
}

/// A team that says it has threads and never runs `work`.
struct Idle;

impl ThreadTeam for Idle {
    fn threads(&self) -> usize {
        4
    }

    fn run(&self, _threads: usize, _work: &(dyn Fn() + Sync)) {}
}

#[test]
fn what_a_team_leaves_undone_the_calling_thread_does() {
    let got = with_thread_team(std::sync::Arc::new(Idle), || {
        map_items((0..9).collect(), true, || (), |_, i| i + 1)
    });
    assert_eq!(got, (1..10).collect::<Vec<_>>());
    let mut scratches: Vec<Mutex<usize>> = Vec::new();
    let done: Vec<AtomicUsize> = (0..9).map(|_| AtomicUsize::new(0)).collect();
    with_thread_team(std::sync::Arc::new(Idle), || {
        for_each_index(
            9,
            true,
            &mut scratches,
            |_| {},
            |taken: &mut usize, i| {
                *taken += 1;
                done[i].fetch_add(1, Ordering::Relaxed);
            },
        )
    });
    assert!(done.iter().all(|d| d.load(Ordering::Relaxed) == 1), "each index once");
    assert_eq!(*scratches[0].get_mut().unwrap(), 9, "the calling thread's scratch took them all");
}
