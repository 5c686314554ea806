//! How fast the kernel creates small files from one or several threads, with nothing of rpull in
//! the way: `openat(O_CREAT|O_EXCL)`, `write`, `futimens`, `close` per file, 1000 directories of
//! 150 files of 1-8 KiB. The measurement behind the write threads (docs/performance.md):
//!
//! ```text
//! cargo run --release -p rpull-extract --example create_rate -- DIR THREADS [same-dirs]
//! ```
//!
//! DIR must not exist. Each thread takes its own directories, or with `same-dirs` every thread
//! writes into every directory (interleaved names).

use std::ffi::CString;
use std::time::Instant;

const DIRS: usize = 1000;
const FILES_PER_DIR: usize = 150;

fn create_files(dir: &str, files: impl Iterator<Item = usize>, data: &[u8]) {
    let path = CString::new(dir).expect("no NUL");
    // SAFETY: plain system calls on a valid C string and buffers that outlive them.
    unsafe {
        let dir_fd = libc::open(path.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY);
        assert!(dir_fd >= 0, "opening {dir}");
        for file in files {
            let name = CString::new(format!("file{file}.txt")).expect("no NUL");
            let fd = libc::openat(
                dir_fd,
                name.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o644,
            );
            assert!(fd >= 0, "creating {dir}/file{file}.txt");
            let length = 1024 + (file * 977) % 7168;
            assert_eq!(
                libc::write(fd, data.as_ptr().cast(), length),
                length as isize
            );
            let times = [libc::timespec {
                tv_sec: 1_600_000_000,
                tv_nsec: 0,
            }; 2];
            assert_eq!(libc::futimens(fd, times.as_ptr()), 0);
            libc::close(fd);
        }
        libc::close(dir_fd);
    }
}

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let (Some(root), Some(threads)) = (arguments.first(), arguments.get(1)) else {
        eprintln!("usage: create_rate DIR THREADS [same-dirs]");
        std::process::exit(2);
    };
    let threads: usize = threads.parse().expect("THREADS is a number");
    let same_dirs = arguments.get(2).is_some_and(|mode| mode == "same-dirs");
    std::fs::create_dir(root).expect("creating DIR (it must not exist)");
    let data = vec![b'x'; 8192];
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let data = &data;
            scope.spawn(move || {
                for dir in 0..DIRS {
                    let path = format!("{root}/d{dir}");
                    if same_dirs {
                        // Whoever comes first makes the directory.
                        let _ = std::fs::create_dir(&path);
                        create_files(&path, (thread..FILES_PER_DIR).step_by(threads), data);
                    } else if dir % threads == thread {
                        std::fs::create_dir(&path).expect("creating a directory");
                        create_files(&path, 0..FILES_PER_DIR, data);
                    }
                }
            });
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{threads} thread(s){}: {} files in {seconds:.3} s = {:.0} files/s",
        if same_dirs { ", same directories" } else { "" },
        DIRS * FILES_PER_DIR,
        (DIRS * FILES_PER_DIR) as f64 / seconds
    );
}
