//! The little of the tar format images need: a ustar writer (0:0 owners, no user or group
//! names, fixed mtime) and a reader that also understands the PAX and GNU long-name records
//! other tools write.

use anyhow::{Result, bail, ensure};

const BLOCK: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Hardlink,
    Other(u8),
}

impl Kind {
    fn flag(self) -> u8 {
        match self {
            Kind::File => b'0',
            Kind::Hardlink => b'1',
            Kind::Symlink => b'2',
            Kind::Dir => b'5',
            Kind::Other(f) => f,
        }
    }

    fn from_flag(flag: u8) -> Kind {
        match flag {
            b'0' | 0 | b'7' => Kind::File,
            b'1' => Kind::Hardlink,
            b'2' => Kind::Symlink,
            b'5' => Kind::Dir,
            other => Kind::Other(other),
        }
    }
}

fn octal(field: &mut [u8], value: u64) -> Result<()> {
    let width = field.len() - 1;
    let text = format!("{value:0width$o}");
    ensure!(text.len() == width, "{value} does not fit a tar header field");
    field[..width].copy_from_slice(text.as_bytes());
    field[width] = 0;
    Ok(())
}

/// Appends one entry (ustar, owner 0:0). Folder names end with `/`.
pub fn append(out: &mut Vec<u8>, name: &str, kind: Kind, mode: u32, mtime: u64, data: &[u8]) -> Result<()> {
    let mut h = [0u8; BLOCK];
    let bytes = name.as_bytes();
    if bytes.len() <= 100 {
        h[..bytes.len()].copy_from_slice(bytes);
    } else {
        // ustar splits long names at a `/` into prefix (155) and name (100)
        let split = (0..bytes.len())
            .rev()
            .find(|&i| bytes[i] == b'/' && i <= 155 && bytes.len() - i - 1 <= 100 && i > 0);
        let Some(i) = split else {
            bail!("{name}: path too long for a ustar header");
        };
        h[..bytes.len() - i - 1].copy_from_slice(&bytes[i + 1..]);
        h[345..345 + i].copy_from_slice(&bytes[..i]);
    }
    octal(&mut h[100..108], u64::from(mode & 0o7777))?;
    octal(&mut h[108..116], 0)?;
    octal(&mut h[116..124], 0)?;
    octal(&mut h[124..136], data.len() as u64)?;
    octal(&mut h[136..148], mtime)?;
    h[156] = kind.flag();
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(BLOCK), 0);
    Ok(())
}

/// The two zero blocks that end an archive.
pub fn finish(out: &mut Vec<u8>) {
    out.resize(out.len() + 2 * BLOCK, 0);
}

/// One entry read back.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    pub name: String,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub link: String,
    pub data: &'a [u8],
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn number(field: &[u8]) -> Result<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        // base-256 (GNU) for large values
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .unwrap_or(u64::MAX);
        }
        return Ok(v);
    }
    let text = cstr(field);
    let text = text.trim_matches(|c: char| c == ' ' || c == '\0');
    if text.is_empty() {
        return Ok(0);
    }
    Ok(u64::from_str_radix(text, 8)?)
}

/// PAX records: `len key=value\n`.
fn pax(data: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(space) = rest.iter().position(|&b| b == b' ') {
        let Ok(len) = String::from_utf8_lossy(&rest[..space]).parse::<usize>() else {
            break;
        };
        if len <= space || len > rest.len() {
            break;
        }
        let record = String::from_utf8_lossy(&rest[space + 1..len]);
        if let Some((k, v)) = record.trim_end_matches('\n').split_once('=') {
            out.push((k.to_string(), v.to_string()));
        }
        rest = &rest[len..];
    }
    out
}

/// Every entry of an archive, in order (PAX/GNU extension records applied, not listed).
pub fn entries(data: &[u8]) -> Result<Vec<Entry<'_>>> {
    let mut out = Vec::new();
    let mut pos = 0;
    let (mut long_name, mut long_link): (Option<String>, Option<String>) = (None, None);
    let mut pax_uid_gid: (Option<u64>, Option<u64>) = (None, None);
    while pos + BLOCK <= data.len() {
        let h = &data[pos..pos + BLOCK];
        if h.iter().all(|&b| b == 0) {
            break;
        }
        let size = usize::try_from(number(&h[124..136])?)?;
        let start = pos + BLOCK;
        ensure!(
            start + size <= data.len(),
            "tar entry runs past the end of the archive"
        );
        let body = &data[start..start + size];
        pos = start + size.next_multiple_of(BLOCK);
        match h[156] {
            b'x' => {
                for (k, v) in pax(body) {
                    match k.as_str() {
                        "path" => long_name = Some(v),
                        "linkpath" => long_link = Some(v),
                        "uid" => pax_uid_gid.0 = v.parse().ok(),
                        "gid" => pax_uid_gid.1 = v.parse().ok(),
                        _ => {}
                    }
                }
                continue;
            }
            b'g' => continue,
            b'L' => {
                long_name = Some(cstr(body));
                continue;
            }
            b'K' => {
                long_link = Some(cstr(body));
                continue;
            }
            _ => {}
        }
        let name = match long_name.take() {
            Some(n) => n,
            None => {
                let prefix = if &h[257..262] == b"ustar" {
                    cstr(&h[345..500])
                } else {
                    String::new()
                };
                let name = cstr(&h[..100]);
                if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                }
            }
        };
        let link = long_link.take().unwrap_or_else(|| cstr(&h[157..257]));
        let (uid, gid) = (
            pax_uid_gid.0.take().map_or_else(|| number(&h[108..116]), Ok)?,
            pax_uid_gid.1.take().map_or_else(|| number(&h[116..124]), Ok)?,
        );
        out.push(Entry {
            name,
            kind: Kind::from_flag(h[156]),
            mode: u32::try_from(number(&h[100..108])? & 0o7777)?,
            uid,
            gid,
            link,
            data: body,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_short_and_long_names() {
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        let mut out = Vec::new();
        append(&mut out, "etc/", Kind::Dir, 0o755, 7, &[]).unwrap();
        append(&mut out, "etc/passwd", Kind::File, 0o644, 7, b"root\n").unwrap();
        append(&mut out, &long, Kind::File, 0o600, 7, b"x").unwrap();
        finish(&mut out);
        assert_eq!(out.len() % BLOCK, 0);
        let e = entries(&out).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(
            (e[0].name.as_str(), e[0].kind, e[0].mode),
            ("etc/", Kind::Dir, 0o755)
        );
        assert_eq!((e[1].name.as_str(), e[1].data), ("etc/passwd", &b"root\n"[..]));
        assert_eq!((e[2].name.as_str(), e[2].mode), (long.as_str(), 0o600));
        assert!(append(&mut Vec::new(), &"x".repeat(101), Kind::File, 0o644, 0, &[]).is_err());
    }

    #[test]
    fn pax_records_override_the_header() {
        let rec = "30 path=a/very/long/name/here\n";
        assert_eq!(rec.len(), 30);
        let mut out = Vec::new();
        append(
            &mut out,
            "PaxHeaders/x",
            Kind::Other(b'x'),
            0o644,
            0,
            rec.as_bytes(),
        )
        .unwrap();
        append(&mut out, "short", Kind::File, 0o644, 0, b"hi").unwrap();
        finish(&mut out);
        let e = entries(&out).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].name, "a/very/long/name/here");
    }
}
