//! Lexical normalisation of tar entry names.

/// Normalises a tar entry name into `out`: components joined by `/`, without empty or `.`
/// components, a leading `/` dropped (as tar does), `..` resolved lexically. Returns `Err` when a
/// `..` climbs above the root. The empty result is the root itself.
pub(crate) fn normalize(name: &[u8], out: &mut Vec<u8>) -> Result<(), &'static str> {
    out.clear();
    for component in name.split(|byte| *byte == b'/') {
        match component {
            b"" | b"." => {}
            b".." => {
                if out.is_empty() {
                    return Err("'..' climbs above the root");
                }
                let cut = out.iter().rposition(|byte| *byte == b'/').unwrap_or(0);
                out.truncate(cut);
            }
            component => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(component);
            }
        }
    }
    Ok(())
}

/// Splits a normalised path into (parent, final component).
pub(crate) fn split_parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|byte| *byte == b'/') {
        Some(slash) => (&path[..slash], &path[slash + 1..]),
        None => (&[], path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_table() {
        let cases: &[(&[u8], Option<&[u8]>)] = &[
            (b"a/b/c", Some(b"a/b/c")),
            (b"./a//b/./c/", Some(b"a/b/c")),
            (b"/etc/passwd", Some(b"etc/passwd")),
            (b"//etc/", Some(b"etc")),
            (b"./", Some(b"")),
            (b"/", Some(b"")),
            (b"a/../b", Some(b"b")),
            (b"a/b/../../c", Some(b"c")),
            (b"a/..", Some(b"")),
            (b"..", None),
            (b"../x", None),
            (b"a/../../x", None),
            (b"/../x", None),
            (b"a/\xff\xfe/b", Some(b"a/\xff\xfe/b")),
            (b"...", Some(b"...")),
        ];
        let mut out = Vec::new();
        for (name, expected) in cases {
            let result = normalize(name, &mut out).ok().map(|()| out.as_slice());
            assert_eq!(
                result,
                *expected,
                "normalize({:?})",
                String::from_utf8_lossy(name)
            );
        }
    }

    #[test]
    fn split() {
        assert_eq!(split_parent(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split_parent(b"c"), (&b""[..], &b"c"[..]));
    }
}
