//! Owner, mode, xattrs and times: read from tar headers, applied through descriptors.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::Timespec;
use rustix::fs::{AtFlags, Gid, Mode, Timestamps, Uid, XattrFlags};
use rustix::io::Errno;

use crate::error::{ExtractError, io_error};
use crate::summary::{Timestamp, Xattr};

const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// The metadata of one tar entry, reused from entry to entry.
#[derive(Debug, Default)]
pub(crate) struct EntryMetadata {
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mtime: Timestamp,
    pub(crate) xattrs: Vec<Xattr>,
}

impl EntryMetadata {
    /// Reads the header fields and the pax records (`mtime` with sub-second precision,
    /// `SCHILY.xattr.*`); the walk already applied pax `uid`, `gid`, `size`, `path`, `linkpath`.
    pub(crate) fn read(
        &mut self,
        header: &tar::Header,
        pax: Option<tar::PaxExtensions<'_>>,
    ) -> io::Result<()> {
        let raw = header.as_bytes();
        self.mode = numeric(&raw[100..108], || header.mode().map(u64::from))? as u32 & 0o7777;
        self.uid = u32::try_from(numeric(&raw[108..116], || header.uid())?)
            .map_err(|_| io::Error::other("uid does not fit 32 bits"))?;
        self.gid = u32::try_from(numeric(&raw[116..124], || header.gid())?)
            .map_err(|_| io::Error::other("gid does not fit 32 bits"))?;
        let mtime = numeric(&raw[136..148], || header.mtime())?;
        self.mtime = Timestamp {
            seconds: i64::try_from(mtime).unwrap_or(i64::MAX),
            nanoseconds: 0,
        };
        self.xattrs.clear();
        if let Some(extensions) = pax {
            for extension in extensions {
                let extension = extension?;
                let key = extension.key_bytes();
                if key == b"mtime" {
                    if let Some(mtime) = parse_pax_time(extension.value_bytes()) {
                        self.mtime = mtime;
                    }
                } else if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                    self.xattrs.push(Xattr {
                        name: name.to_vec(),
                        value: extension.value_bytes().to_vec(),
                    });
                }
            }
        }
        Ok(())
    }

    pub(crate) fn timestamps(&self) -> Timestamps {
        timestamps(self.mtime)
    }
}

/// A numeric header field: `raw` in the common form (octal digits between ASCII spaces, up to
/// a NUL) read here, anything else by `parse`, the tar crate's reader of that field (base-256,
/// a sign, errors naming the entry). An empty field (all NUL or spaces, as some writers leave
/// unused ones) reads as 0 like Go's archive/tar does; anything else `parse` refuses is an error.
///
/// Both readers give the same value wherever the first answers; the first is there for speed:
/// the tar crate makes a `str` of each field and parses it with `from_str_radix`, about 300
/// instructions a field, and reading the common form here saves about 170 of them (session 55,
/// callgrind of a layer of small files: 11% of the extraction's user-space instructions).
fn numeric(raw: &[u8], parse: impl FnOnce() -> io::Result<u64>) -> io::Result<u64> {
    if let Some(value) = plain_octal(raw) {
        return Ok(value);
    }
    match parse() {
        Ok(value) => Ok(value),
        Err(_) if raw.iter().all(|byte| *byte == 0 || *byte == b' ') => Ok(0),
        Err(error) => Err(error),
    }
}

/// `field` up to its first NUL, less ASCII whitespace at both ends, when that is 1 to 21 octal
/// digits (so that the value fits 64 bits); `None` for anything else.
pub(crate) fn plain_octal(field: &[u8]) -> Option<u64> {
    let end = field
        .iter()
        .position(|byte| *byte == 0)
        .unwrap_or(field.len());
    let digits = field[..end].trim_ascii();
    if digits.is_empty() || digits.len() > 21 {
        return None;
    }
    digits.iter().try_fold(0u64, |value, digit| {
        (b'0'..=b'7')
            .contains(digit)
            .then(|| value << 3 | u64::from(digit - b'0'))
    })
}

pub(crate) fn timestamps(mtime: Timestamp) -> Timestamps {
    let time = Timespec {
        tv_sec: mtime.seconds,
        tv_nsec: i64::from(mtime.nanoseconds),
    };
    Timestamps {
        last_access: time,
        last_modification: time,
    }
}

/// Parses a pax time, `[-]SECONDS[.FRACTION]`.
pub(crate) fn parse_pax_time(value: &[u8]) -> Option<Timestamp> {
    let text = std::str::from_utf8(value).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (seconds, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut seconds: i64 = seconds.parse().ok()?;
    let digits: String = fraction.chars().take(9).collect();
    if !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let mut nanoseconds: u32 = if digits.is_empty() {
        0
    } else {
        format!("{digits:0<9}").parse().ok()?
    };
    if negative {
        seconds = -seconds;
        if nanoseconds > 0 {
            seconds -= 1;
            nanoseconds = 1_000_000_000 - nanoseconds;
        }
    }
    Some(Timestamp {
        seconds,
        nanoseconds,
    })
}

/// What a newly created regular file gets without being asked, so that `fchmod`/`fchown` calls
/// that would change nothing are skipped (two of the five system calls of a small file).
///
/// A file created with mode `m` gets `m & !umask` unless its directory has a default ACL, and the
/// creator's fsuid and fsgid unless its directory is setgid. Directories created while a layer is
/// extracted are `0700` and never setgid, so checking the target directory once covers them all.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Creation {
    /// `None` when the umask is unknown or a default ACL may override it: always `fchmod`.
    umask: Option<u32>,
    /// `None` when the target is setgid: always `fchown`.
    owner: Option<(u32, u32)>,
}

impl Creation {
    /// Inspects the process (umask from `/proc/self/status`, effective ids) and the target
    /// directory (setgid bit, default ACL) once per layer.
    pub(crate) fn probe(target: &std::path::Path, target_fd: BorrowedFd<'_>) -> Self {
        let umask = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                let line = status.lines().find(|line| line.starts_with("Umask:"))?;
                u32::from_str_radix(line["Umask:".len()..].trim(), 8).ok()
            });
        // A default ACL replaces the umask for new files (any answer but "none" counts as one).
        let default_acl = !matches!(
            rustix::fs::getxattr(target, "system.posix_acl_default", &mut [0u8; 0][..]),
            Err(Errno::NODATA | Errno::NOTSUP)
        );
        let setgid = rustix::fs::fstat(target_fd)
            .map(|stat| stat.st_mode & libc::S_ISGID != 0)
            .unwrap_or(true);
        Self {
            umask: umask.filter(|_| !default_acl),
            owner: (!setgid).then(|| {
                (
                    rustix::process::geteuid().as_raw(),
                    rustix::process::getegid().as_raw(),
                )
            }),
        }
    }

    /// `(mode to create with, mode still to apply, owner still to apply)` for a regular file that
    /// should end up with `mode` and, when `chown`, `uid:gid`. Setuid/setgid/sticky bits are always
    /// applied after the data (a write by an unprivileged process clears them, chown too).
    pub(crate) fn plan(
        &self,
        mode: u32,
        uid: u32,
        gid: u32,
        chown: bool,
    ) -> (u32, Option<u32>, Option<(u32, u32)>) {
        let owner = (chown && self.owner != Some((uid, gid))).then_some((uid, gid));
        match self.umask {
            Some(umask) if mode & 0o7000 == 0 && mode & umask == 0 => (mode, None, owner),
            _ => (0o600, Some(mode), owner),
        }
    }
}

/// Decides what happens when the file system refuses an xattr, and warns once.
///
/// Clones share the "warned once" state, so threads working for one layer (or one finalize) warn
/// once between them.
#[derive(Debug, Clone)]
pub(crate) struct XattrPolicy {
    chown: bool,
    warned: Arc<AtomicBool>,
}

impl XattrPolicy {
    pub(crate) fn new(chown: bool) -> Self {
        Self {
            chown,
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// `Ok` when the refusal is tolerated (logged), `Err` when it must fail the layer: any error
    /// other than "not supported / not permitted", and `security.capability` when running with
    /// `chown` (as root), because silently dropping a file capability breaks the program that needs
    /// it (ping, ...) in a way nobody notices.
    pub(crate) fn refused(
        &mut self,
        entry: &[u8],
        xattr: &[u8],
        errno: Errno,
    ) -> Result<(), ExtractError> {
        let tolerable = matches!(errno, Errno::NOTSUP | Errno::PERM | Errno::ACCESS);
        if !tolerable || (self.chown && xattr == CAPABILITY_XATTR) {
            return Err(io_error(entry, "setting extended attribute", errno));
        }
        let name = String::from_utf8_lossy(xattr);
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(entry = %crate::resolve::lossy(entry), xattr = %name, %errno, "extended attribute not stored");
        } else {
            tracing::warn!(
                entry = %crate::resolve::lossy(entry), xattr = %name, %errno,
                "the file system refused an extended attribute; further refusals in this layer are logged at debug level"
            );
        }
        Ok(())
    }
}

/// Owner (before the mode: chown clears setuid/setgid), mode, xattrs (after chown, which clears
/// `security.capability`), times, all through the open descriptor of a regular file or directory.
/// `owner` is `None` when owners are not applied.
pub(crate) fn apply_fd_parts(
    fd: BorrowedFd<'_>,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
    xattrs: &[Xattr],
    mtime: Timestamp,
    policy: &mut XattrPolicy,
    entry: &[u8],
) -> Result<(), ExtractError> {
    if let Some((uid, gid)) = owner {
        rustix::fs::fchown(fd, Some(uid_of(uid)), Some(gid_of(gid)))
            .map_err(|errno| io_error(entry, "changing owner of", errno))?;
    }
    if let Some(mode) = mode {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))
            .map_err(|errno| io_error(entry, "changing mode of", errno))?;
    }
    for xattr in xattrs {
        if let Err(errno) =
            rustix::fs::fsetxattr(fd, xattr.name.as_slice(), &xattr.value, XattrFlags::empty())
        {
            policy.refused(entry, &xattr.name, errno)?;
        }
    }
    rustix::fs::futimens(fd, &timestamps(mtime))
        .map_err(|errno| io_error(entry, "setting times of", errno))
}

/// `lsetxattr` of `name` in `dir`. There is no lsetxattrat before Linux 6.13: the file is named
/// through our own directory descriptor in /proc (the magic link is ours; lsetxattr does not follow
/// the final name).
fn set_xattrs_nofollow(
    dir: BorrowedFd<'_>,
    name: &CStr,
    xattrs: &[Xattr],
    policy: &mut XattrPolicy,
    entry: &[u8],
) -> Result<(), ExtractError> {
    if xattrs.is_empty() {
        return Ok(());
    }
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name.to_bytes());
    for xattr in xattrs {
        if let Err(errno) = rustix::fs::lsetxattr(
            path.as_slice(),
            xattr.name.as_slice(),
            &xattr.value,
            XattrFlags::empty(),
        ) {
            policy.refused(entry, &xattr.name, errno)?;
        }
    }
    Ok(())
}

/// Owner, xattrs and times of `name` in `dir` without following it (symlinks, device nodes).
pub(crate) fn apply_nofollow(
    dir: BorrowedFd<'_>,
    name: &CStr,
    metadata: &EntryMetadata,
    chown: bool,
    policy: &mut XattrPolicy,
    entry: &[u8],
) -> Result<(), ExtractError> {
    if chown {
        rustix::fs::chownat(
            dir,
            name,
            Some(uid_of(metadata.uid)),
            Some(gid_of(metadata.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|errno| io_error(entry, "changing owner of", errno))?;
    }
    set_xattrs_nofollow(dir, name, &metadata.xattrs, policy, entry)?;
    rustix::fs::utimensat(dir, name, &metadata.timestamps(), AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|errno| io_error(entry, "setting times of", errno))
}

fn uid_of(uid: u32) -> Uid {
    // u32::MAX would mean "leave unchanged" to chown; tar cannot express it meaningfully anyway.
    Uid::from_raw_unchecked(uid)
}

fn gid_of(gid: u32) -> Gid {
    Gid::from_raw_unchecked(gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields the tar crate reads itself (base-256, signs, odd whitespace, garbage) and the
    /// common ones read here give the same values and the same refusals as the tar crate alone.
    #[test]
    fn numeric_fields_read_as_the_tar_crate_reads_them() {
        let fields: &[&[u8]] = &[
            b"0000644\0",
            b"0000644 ",
            b" 644\0\0\0\0",
            b"644",
            b"00001750\0",
            b"77777777",
            b"\0\0\0\0\0\0\0\0",
            b"        ",
            b"0\0garbage",
            b"+644\0",
            b"-1\0",
            b"0008\0",
            b"12 34\0",
            b"\x0b644\0",
            b"\t644\n\0",
            b"644\x0c\0",
            b"\x80\0\0\0\0\0\0\x01",
            b"\xff\xff\xff\xff\xff\xff\xff\xff",
            b"\xc3\xa9\0",
            b"\xc2\xa0644\0",
            b"14703426400\0",
            b"77777777777\0",
            b"777777777777",
        ];
        let old_numeric = |parsed: io::Result<u64>, raw: &[u8]| match parsed {
            Ok(value) => Ok(value),
            Err(_) if raw.iter().all(|byte| *byte == 0 || *byte == b' ') => Ok(0),
            Err(error) => Err(error),
        };
        for field in fields {
            for (range, name) in [(100..108, "mode"), (108..116, "uid"), (136..148, "mtime")] {
                let mut block = [0u8; 512];
                let len = field.len().min(range.len());
                block[range.start..range.start + len].copy_from_slice(&field[..len]);
                let header = tar::Header::from_byte_slice(&block);
                let raw = &block[range];
                let (tar_crate, here) = match name {
                    "mode" => (
                        old_numeric(header.mode().map(u64::from), raw),
                        numeric(raw, || header.mode().map(u64::from)),
                    ),
                    "uid" => (
                        old_numeric(header.uid(), raw),
                        numeric(raw, || header.uid()),
                    ),
                    _ => (
                        old_numeric(header.mtime(), raw),
                        numeric(raw, || header.mtime()),
                    ),
                };
                assert_eq!(
                    tar_crate.as_ref().ok(),
                    here.as_ref().ok(),
                    "{name} field {:?}",
                    String::from_utf8_lossy(field)
                );
            }
        }
        assert_eq!(plain_octal(b"0000644\0"), Some(0o644));
        assert_eq!(plain_octal(b"14703426400\0"), Some(0o14703426400));
        assert_eq!(plain_octal(b"+644"), None);
        assert_eq!(plain_octal(b"\x80\0\0\0\0\0\0\x01"), None);
    }

    #[test]
    fn pax_times() {
        type Case = (&'static [u8], Option<(i64, u32)>);
        let cases: &[Case] = &[
            (b"1700000000", Some((1_700_000_000, 0))),
            (b"1700000000.5", Some((1_700_000_000, 500_000_000))),
            (
                b"1700000000.123456789123",
                Some((1_700_000_000, 123_456_789)),
            ),
            (b"-1.25", Some((-2, 750_000_000))),
            (b"abc", None),
            (b"1.x", None),
        ];
        for (value, expected) in cases {
            let parsed = parse_pax_time(value).map(|time| (time.seconds, time.nanoseconds));
            assert_eq!(parsed, *expected, "{}", String::from_utf8_lossy(value));
        }
    }
}
