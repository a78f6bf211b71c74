//! nodewarden-sys: the one call into the C library that nodewarden makes, behind a safe function.
//!
//! The workspace forbids `unsafe` code (`[workspace.lints]`); this crate exists so that the one
//! exception stays in one place, with its own lints (`unsafe_code = "deny"`, allowed on a
//! single function) and its safety argument beside it.
//!
//! [`release_free_heap`] is glibc's `malloc_trim(0)`. glibc's `malloc` gives memory back to the
//! kernel on its own only from the top of the heap; free space *below* live chunks stays
//! resident until `malloc_trim` `madvise`s its whole pages away. The node agent allocates a
//! transient peak every round (the pod and its update, in `updateMode: InPlace`) and calls this
//! once a round: see docs/benchmarks.md, "Agent: RSS and CPU with 100 autoscaled containers".

/// Gives the allocator's free heap back to the kernel: whole free pages anywhere in glibc's
/// heaps (not only at their top), through `malloc_trim(0)`. Returns whether any memory was
/// released.
///
/// Live allocations are untouched; a later allocation that reuses a released page takes a page
/// fault and a zeroed page. The cost grows with the number of free chunks, so call it at a
/// quiet point (after a round of work), not per allocation. A no-op that returns `false` off
/// glibc (musl and other C libraries have no `malloc_trim`; musl's `malloc` returns free pages
/// by itself).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn release_free_heap() -> bool {
    // SAFETY: `malloc_trim` takes a plain integer and touches no memory of the caller's: it
    // takes the allocator's own locks, consolidates its free lists and `madvise`s free pages.
    // glibc documents it MT-Safe. Rust's global allocator on this target is the system one,
    // i.e. this `malloc`, so the heap it trims is the one Rust allocates from.
    unsafe { libc::malloc_trim(0) != 0 }
}

/// Gives the allocator's free heap back to the kernel: nothing to do off glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_heap() -> bool {
    false
}

#[cfg(test)]
mod tests {
    /// Free space below a live chunk is what glibc keeps and `malloc_trim` gives back: with 4 MiB
    /// freed under a block still in use, the call must report memory released (on glibc; the
    /// no-op elsewhere reports none), and the live block must keep its contents.
    #[test]
    fn releases_free_space_below_a_live_chunk() {
        // 64 KiB blocks: under glibc's mmap threshold (128 KiB), so they come from the heap
        let mut blocks: Vec<Vec<u8>> = (0..65).map(|i| vec![i as u8; 64 << 10]).collect();
        let live = blocks.pop().expect("65 blocks");
        drop(blocks);
        let released = super::release_free_heap();
        assert_eq!(released, cfg!(all(target_os = "linux", target_env = "gnu")));
        assert!(live.iter().all(|&b| b == 64));
    }
}
