//! glibc's allocator, set for streaming.
//!
//! hyper reads each chunk of a blob into a new buffer of up to about 400 KiB; the chunk is freed
//! on the decode thread once decoded. With glibc's default dynamic thresholds, free memory at
//! the top of a heap is given back to the kernel (`madvise`) as soon as it exceeds twice the
//! largest chunk seen, so the next receive buffer lands on pages that fault in again, zeroed,
//! inside `recv` on the thread that receives and hashes, the critical path of a big layer.
//! Measured on a 1 GB single-layer pull into tmpfs: 49-83k minor faults, about a quarter of the
//! blob's pages; with these settings 3-8k (docs/performance.md).
//!
//! The settings only keep freed memory for reuse: what is live, and so the peak RSS, is bounded
//! by the pipeline's queues as before.

/// Allocations up to this size come from the heap, not a fresh `mmap` each (the most glibc's
/// dynamic threshold ever rises to on 64-bit).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;
/// Free memory at the top of a heap is given back only beyond this.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 128 << 20;

/// Sets glibc's mmap and trim thresholds, unless the user set malloc tunables of their own in
/// `GLIBC_TUNABLES`. Returns whether they were set. Called first thing in `main`.
pub fn tune() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let user_set = std::env::var("GLIBC_TUNABLES")
            .is_ok_and(|tunables| tunables.contains("glibc.malloc."));
        if user_set {
            return false;
        }
        // SAFETY: mallopt only changes allocator parameters, under the allocator's own lock.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// Minor page faults of the calling thread so far.
    fn thread_minor_faults() -> i64 {
        // SAFETY: rusage is plain integers, for which all zeroes is a valid value.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage only writes into the struct it is given.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        assert_eq!(rc, 0, "getrusage(RUSAGE_THREAD)");
        usage.ru_minflt
    }

    /// Allocates, fills and frees eight receive-sized buffers (3.2 MiB) `rounds` times; returns
    /// the page faults of all rounds but the first.
    fn faults_after_the_first_round(rounds: usize) -> i64 {
        let mut before = 0;
        for round in 0..rounds {
            if round == 1 {
                before = thread_minor_faults();
            }
            let buffers: Vec<Vec<u8>> = (0..8).map(|i| vec![i as u8 + 1; 400 << 10]).collect();
            std::hint::black_box(&buffers);
        }
        thread_minor_faults() - before
    }

    #[test]
    fn freed_receive_buffers_are_reused_without_faulting_again() {
        if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
            assert!(!super::tune());
            return;
        }
        assert!(super::tune());
        // With glibc's defaults each round gives its 3.2 MiB back and faults about 800 pages
        // in again; with the thresholds set, the rounds after the first reuse the same pages.
        let faults = faults_after_the_first_round(20);
        assert!(
            faults < 200,
            "{faults} page faults in 19 rounds of reused buffers"
        );
    }
}
