use super::*;

/// `len` zeros, as a call takes them and a piece of its work zeroes them.
fn zeros<T: Element>(len: usize) -> Buffer<T> {
    take(len).zeroed()
}

/// The sizes in bytes of this thread's kept buffers, oldest first.
fn kept_sizes() -> Vec<usize> {
    KEPT.with_borrow(|shelf| {
        let sizes: Vec<usize> = shelf.kept.iter().map(|k| k.bytes).collect();
        assert_eq!(sizes.iter().sum::<usize>(), shelf.bytes, "the running total is the kept bytes");
        sizes
    })
}

#[test]
fn a_kept_buffer_is_taken_again_zeroed_and_at_its_length() {
    let mut buffer = zeros::<f32>(1000);
    buffer.iter_mut().for_each(|x| *x = 7.0);
    let address = buffer.as_ptr();
    keep(buffer);
    let again = zeros::<f32>(900);
    assert_eq!(again.as_ptr(), address, "the same memory");
    assert_eq!(again.len(), 900);
    assert!(again.iter().all(|&x| x == 0.0), "nothing of the last call's values");
    assert!(kept_sizes().is_empty(), "taken out of the kept list");
}

#[test]
fn the_smallest_kept_buffer_that_holds_the_length_is_taken() {
    let (small, middle, large) = (zeros::<f32>(100), zeros::<f32>(5000), zeros::<f32>(50_000));
    let (small_at, middle_at) = (small.as_ptr(), middle.as_ptr());
    [large, middle, small].into_iter().for_each(keep);
    assert_eq!(zeros::<f32>(4000).as_ptr(), middle_at);
    assert_eq!(zeros::<f32>(16).as_ptr(), small_at);
    assert_eq!(kept_sizes().len(), 1, "the large one is left");
}

#[test]
fn a_buffer_of_another_element_type_or_too_small_is_not_taken() {
    let f64s = zeros::<f64>(1000);
    let address = f64s.as_ptr() as usize;
    keep(f64s);
    let f32s = zeros::<f32>(1000);
    assert_ne!(f32s.as_ptr() as usize, address);
    keep(f32s);
    let longer = zeros::<f64>(100_000);
    assert_ne!(longer.as_ptr() as usize, address);
    assert_eq!(kept_sizes().len(), 2, "both still kept");
}

#[test]
fn a_thread_keeps_at_most_its_limit_dropping_the_oldest_first() {
    let quarter = KEEP_BYTES / 4 / size_of::<f32>();
    let buffers: Vec<Buffer<f32>> = (0..5).map(|_| zeros(quarter)).collect();
    let addresses: Vec<_> = buffers.iter().map(|b| b.as_ptr()).collect();
    buffers.into_iter().for_each(keep);
    let sizes = kept_sizes();
    assert_eq!(sizes.len(), 4, "the first of five quarters dropped: {sizes:?}");
    assert!(sizes.iter().sum::<usize>() <= KEEP_BYTES);
    let taken: Vec<_> = (0..4).map(|_| zeros::<f32>(quarter)).collect();
    for buffer in &taken {
        assert!(addresses[1..].contains(&buffer.as_ptr()), "one of the last four kept");
    }
    keep(zeros::<f32>(KEEP_BYTES / size_of::<f32>() + 1));
    assert!(kept_sizes().is_empty(), "a buffer larger than the limit is not kept");
}
