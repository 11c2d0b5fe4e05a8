//! A late helper keeps small work on the calling thread for a window that grows while helpers
//! stay late.

use super::*;

const LATE: Duration = KEPT_WAITING_FROM;
const PROMPT: Duration = Duration::from_micros(40);

#[test]
fn prompt_helpers_leave_sharing_alone() {
    let seen = Contention::new();
    for at in [1, 1_000, 1_000_000_000] {
        seen.arrived(PROMPT, at);
        assert!(!seen.holds(at));
    }
}

#[test]
fn a_late_helper_keeps_small_work_home_for_a_window_that_doubles_while_helpers_stay_late() {
    let seen = Contention::new();
    let mut now = 1_000;
    for doublings in [0, 1, 2, 3, 4, 5, 5, 5] {
        seen.arrived(LATE, now);
        let end = now + (FIRST_WINDOW_NS << doublings);
        assert_eq!(seen.kept_waiting(now), Some(LATE), "window {doublings}");
        assert!(seen.holds(end - 1) && !seen.holds(end), "window {doublings} ends");
        // Helpers on time within the window do not end the streak.
        seen.arrived(PROMPT, end - 1);
        now = end;
    }
    assert_eq!(seen.kept_waiting(now), None);
    // A late helper long after the last window opens the first window again.
    now += STREAK_GAP_NS;
    seen.arrived(LATE * 3, now);
    assert_eq!(seen.kept_waiting(now + FIRST_WINDOW_NS - 1), Some(LATE * 3), "the last one's lateness");
    assert!(!seen.holds(now + FIRST_WINDOW_NS));
}

#[test]
fn a_helper_on_time_after_the_window_ends_the_streak() {
    let seen = Contention::new();
    seen.arrived(LATE, 1_000);
    seen.arrived(LATE, 2_000);
    let end = 2_000 + (FIRST_WINDOW_NS << 1);
    assert!(seen.holds(end - 1) && !seen.holds(end));
    seen.arrived(PROMPT, end);
    // The next late helper, soon after, opens the first window, not a doubled one.
    seen.arrived(LATE, end + 1);
    assert!(seen.holds(end + FIRST_WINDOW_NS) && !seen.holds(end + 1 + FIRST_WINDOW_NS));
}
