//! A helper leaves its caller's CPU and keeps the CPUs it was allowed; a pinned one stays.

use std::mem::{size_of, zeroed};

use super::*;

fn allowed() -> libc::cpu_set_t {
    // SAFETY: an all-zero `cpu_set_t` is an empty set, filled for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = zeroed();
        assert_eq!(libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set), 0);
        set
    }
}

fn allow(set: &libc::cpu_set_t) {
    // SAFETY: sets the calling thread's CPUs to a set read from it earlier.
    assert_eq!(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), set) }, 0);
}

fn same(a: &libc::cpu_set_t, b: &libc::cpu_set_t) -> bool {
    // SAFETY: every CPU asked about is below `CPU_SETSIZE`.
    (0..libc::CPU_SETSIZE as usize).all(|c| unsafe { libc::CPU_ISSET(c, a) == libc::CPU_ISSET(c, b) })
}

fn count(set: &libc::cpu_set_t) -> i32 {
    // SAFETY: counts the members of a set read from the kernel.
    unsafe { libc::CPU_COUNT(set) }
}

fn only(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: an all-zero `cpu_set_t` is an empty set; `cpu` came from `sched_getcpu`, below
    // `CPU_SETSIZE`.
    unsafe {
        let mut set: libc::cpu_set_t = zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    }
}

/// A caller on `cpu` that is not the thread calling this.
fn caller_elsewhere(cpu: usize) -> Caller {
    let thread = std::thread::spawn(|| ()).thread().id();
    Caller { thread, cpu: Some(cpu) }
}

#[test]
fn a_helper_on_its_callers_cpu_moves_off_it_and_keeps_the_cpus_it_was_allowed() {
    if count(&allowed()) < 2 {
        eprintln!("skipped: this process may run on one CPU only");
        return;
    }
    std::thread::spawn(|| {
        let before = allowed();
        for _ in 0..20 {
            let cpu = current_cpu().expect("Linux says which CPU");
            caller_elsewhere(cpu).arrive();
            assert_ne!(current_cpu(), Some(cpu), "the helper stayed on its caller's CPU");
            assert!(same(&allowed(), &before), "the helper's allowed CPUs changed");
            // On another CPU than the caller's it has no reason to move.
            let here = current_cpu().unwrap();
            caller_elsewhere(here + 1).arrive();
            assert!(same(&allowed(), &before));
        }
    })
    .join()
    .unwrap();
}

#[test]
fn a_helper_allowed_one_cpu_and_the_caller_itself_stay_where_they_are() {
    std::thread::spawn(|| {
        let cpu = current_cpu().unwrap();
        let one = only(cpu);
        allow(&one);
        caller_elsewhere(cpu).arrive();
        assert_eq!(current_cpu(), Some(cpu));
        assert!(same(&allowed(), &one), "a pinned helper must stay pinned");
    })
    .join()
    .unwrap();
    std::thread::spawn(|| {
        let before = allowed();
        let caller = Caller::here();
        // The caller yields its CPU and keeps its allowed CPUs, whichever CPU it then runs on.
        caller.arrive();
        assert!(same(&allowed(), &before));
    })
    .join()
    .unwrap();
}
