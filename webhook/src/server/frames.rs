//! A count of the HTTP/2 control frames a client sends, read from the frame headers of the
//! decrypted byte stream before hyper's HTTP/2 (h2) sees it.
//!
//! h2 answers every SETTINGS frame, and one that changes `SETTINGS_INITIAL_WINDOW_SIZE` makes it
//! update every open stream of the connection, on the thread that serves every other connection
//! too. h2 has no limit on how often a client may do that, nor a hook to count it, so this
//! reader counts SETTINGS, PING and PRIORITY frames itself and stops the connection when a client
//! sends more than its allowance in one second ([`ControlFrames::feed`] returns [`TooMany`]).
//! The serving task then answers GOAWAY with `ENHANCE_YOUR_CALM` and closes.
//!
//! The reader keeps nine bytes of state: it skips the 24-byte client preface, reads each 9-byte
//! frame header (whole or in pieces, as the bytes arrive) and skips the payload by its length.
//! It never allocates and never looks into a payload, and any byte sequence is read the same
//! whatever pieces it arrives in (fuzzed: `fuzz/fuzz_targets/h2_frames.rs`). What it reads
//! wrongly, h2 refuses anyway: the connection ends either way.

use std::time::{Duration, Instant};

/// Bytes of the HTTP/2 client connection preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
pub const PREFACE_LEN: usize = 24;
/// Bytes of an HTTP/2 frame header.
pub const HEADER_LEN: usize = 9;

/// Frame types, RFC 9113 section 6.
pub const DATA: u8 = 0x0;
/// HEADERS
pub const HEADERS: u8 = 0x1;
/// PRIORITY
pub const PRIORITY: u8 = 0x2;
/// SETTINGS
pub const SETTINGS: u8 = 0x4;
/// PING
pub const PING: u8 = 0x6;
/// GOAWAY
pub const GOAWAY: u8 = 0x7;
/// The GOAWAY error code for a peer that sends too much: `ENHANCE_YOUR_CALM`.
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Control frames (SETTINGS, PING, PRIORITY) a client may send on one connection within one
/// second. A client that sets up its connection sends one or two SETTINGS, acknowledges the
/// server's, and pings every few seconds at most; the limit is far above that.
pub const CONTROL_FRAMES_PER_SECOND: u32 = 100;

/// The client sent more control frames in one second than it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooMany {
    /// The frame type that passed the limit.
    pub kind: u8,
}

impl std::fmt::Display for TooMany {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "more than {CONTROL_FRAMES_PER_SECOND} HTTP/2 control frames (SETTINGS, PING, PRIORITY) in one second; last type {:#x}",
            self.kind
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// Preface bytes still to skip.
    Preface(u8),
    /// A frame header, `filled` of its nine bytes read.
    Header { bytes: [u8; HEADER_LEN], filled: u8 },
    /// Payload bytes still to skip.
    Payload(u32),
}

/// What has been read so far, for tests and the fuzz target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// Whole frame headers read.
    pub frames: u64,
    /// Of those, SETTINGS, PING and PRIORITY frames.
    pub control: u64,
    /// Highest stream id of a HEADERS frame, for the GOAWAY's last stream.
    pub last_stream: u32,
}

/// The control-frame count of one HTTP/2 connection's incoming bytes.
#[derive(Debug, Clone)]
pub struct ControlFrames {
    reading: Reading,
    per_second: u32,
    /// When the current one-second window began, and control frames within it.
    window: Option<Instant>,
    in_window: u32,
    seen: Seen,
}

impl ControlFrames {
    /// A reader for a connection's bytes from its first (the preface); at most `per_second`
    /// control frames within any one-second window that begins at a control frame.
    pub fn new(per_second: u32) -> Self {
        ControlFrames {
            reading: Reading::Preface(PREFACE_LEN as u8),
            per_second,
            window: None,
            in_window: 0,
            seen: Seen::default(),
        }
    }

    /// What has been read so far.
    pub fn seen(&self) -> Seen {
        self.seen
    }

    /// Reads the next bytes of the connection; `now` is asked only when a control frame is read.
    /// After `Err`, the connection is to be closed; further calls read on.
    pub fn feed(&mut self, mut bytes: &[u8], mut now: impl FnMut() -> Instant) -> Result<(), TooMany> {
        let mut verdict = Ok(());
        while !bytes.is_empty() {
            match &mut self.reading {
                Reading::Preface(left) => {
                    let n = bytes.len().min(usize::from(*left));
                    bytes = bytes.get(n..).unwrap_or_default();
                    // n <= *left <= 24
                    *left -= n as u8;
                    if *left == 0 {
                        self.reading = Reading::Header {
                            bytes: [0; HEADER_LEN],
                            filled: 0,
                        };
                    }
                }
                Reading::Payload(left) => {
                    let n = bytes.len().min(*left as usize);
                    bytes = bytes.get(n..).unwrap_or_default();
                    *left -= n as u32;
                    if *left == 0 {
                        self.reading = Reading::Header {
                            bytes: [0; HEADER_LEN],
                            filled: 0,
                        };
                    }
                }
                Reading::Header {
                    bytes: header,
                    filled,
                } => {
                    let at = usize::from(*filled);
                    let n = bytes.len().min(HEADER_LEN - at);
                    if let (Some(to), Some(from)) = (header.get_mut(at..at + n), bytes.get(..n)) {
                        to.copy_from_slice(from);
                    }
                    bytes = bytes.get(n..).unwrap_or_default();
                    *filled += n as u8;
                    if usize::from(*filled) < HEADER_LEN {
                        continue;
                    }
                    let header = *header;
                    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]);
                    let kind = header[3];
                    let stream =
                        u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
                    self.reading = if length == 0 {
                        Reading::Header {
                            bytes: [0; HEADER_LEN],
                            filled: 0,
                        }
                    } else {
                        Reading::Payload(length)
                    };
                    self.seen.frames += 1;
                    if kind == HEADERS {
                        self.seen.last_stream = self.seen.last_stream.max(stream);
                    }
                    if matches!(kind, SETTINGS | PING | PRIORITY) {
                        self.seen.control += 1;
                        if let Err(too_many) = self.count(kind, &mut now) {
                            verdict = Err(too_many);
                        }
                    }
                }
            }
        }
        verdict
    }

    fn count(&mut self, kind: u8, now: &mut impl FnMut() -> Instant) -> Result<(), TooMany> {
        let at = now();
        match self.window {
            Some(start) if at.saturating_duration_since(start) < Duration::from_secs(1) => {
                self.in_window = self.in_window.saturating_add(1);
            }
            _ => {
                self.window = Some(at);
                self.in_window = 1;
            }
        }
        if self.in_window > self.per_second {
            return Err(TooMany { kind });
        }
        Ok(())
    }
}

/// The bytes of a GOAWAY frame: `last_stream`, `code`, no debug data.
pub fn goaway(last_stream: u32, code: u32) -> [u8; HEADER_LEN + 8] {
    let mut frame = [0u8; HEADER_LEN + 8];
    frame[2] = 8;
    frame[3] = GOAWAY;
    frame[9..13].copy_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    frame[13..17].copy_from_slice(&code.to_be_bytes());
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        for f in frames {
            bytes.extend_from_slice(f);
        }
        bytes
    }

    #[test]
    fn frames_are_counted_whatever_pieces_they_arrive_in() {
        let bytes = connection(&[
            frame(SETTINGS, 0, &[0, 4, 0, 0, 0, 0]),
            frame(HEADERS, 1, &[0x82; 30]),
            frame(DATA, 1, &[b'x'; 1000]),
            frame(PING, 0, &[0; 8]),
            frame(HEADERS, 7, &[0x82; 3]),
            frame(SETTINGS, 0, &[]),
        ]);
        let now = Instant::now();
        let mut whole = ControlFrames::new(100);
        whole.feed(&bytes, || now).expect("under the limit");
        let expected = Seen {
            frames: 6,
            control: 3,
            last_stream: 7,
        };
        assert_eq!(whole.seen(), expected);
        for piece in [1, 2, 5, 9, 10, 23, 24, 25, 1000] {
            let mut split = ControlFrames::new(100);
            for chunk in bytes.chunks(piece) {
                split.feed(chunk, || now).expect("under the limit");
            }
            assert_eq!(split.seen(), expected, "in pieces of {piece}");
        }
    }

    #[test]
    fn more_control_frames_than_allowed_in_a_second_is_too_many() {
        let start = Instant::now();
        let mut clock = start;
        let mut frames = ControlFrames::new(3);
        let settings = frame(SETTINGS, 0, &[0, 4, 0, 0, 0, 1]);
        frames.feed(&connection(&[]), || clock).expect("preface");
        for _ in 0..3 {
            frames.feed(&settings, || clock).expect("within the allowance");
        }
        assert_eq!(frames.feed(&settings, || clock), Err(TooMany { kind: SETTINGS }));
        // a second later, a new window
        clock = start + Duration::from_millis(1001);
        let mut frames = ControlFrames::new(3);
        frames.feed(&connection(&[]), || start).expect("preface");
        for _ in 0..3 {
            frames.feed(&settings, || start).expect("first second");
        }
        for _ in 0..3 {
            frames.feed(&settings, || clock).expect("next second");
        }
        // DATA and HEADERS are never counted, and ask no clock
        let data = frame(DATA, 1, &[0; 10]);
        for _ in 0..1000 {
            frames
                .feed(&data, || panic!("asked the clock for a DATA frame"))
                .expect("data");
        }
    }

    /// The invariants of the fuzz target (`fuzz/fuzz_targets/h2_frames.rs`) on pseudo-random
    /// inputs made of plausible frames, cut anywhere.
    #[test]
    fn random_connections_read_the_same_whole_and_in_pieces() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let now = Instant::now();
        for _ in 0..2000 {
            let mut frames = Vec::new();
            let (mut control, mut last_stream) = (0u64, 0u32);
            for _ in 0..next() % 12 {
                let kind = (next() % 10) as u8;
                let stream = (next() % 50) as u32;
                let payload = vec![0u8; (next() % 40) as usize];
                control += u64::from(matches!(kind, SETTINGS | PING | PRIORITY));
                if kind == HEADERS {
                    last_stream = last_stream.max(stream);
                }
                frames.push(frame(kind, stream, &payload));
            }
            let count = frames.len() as u64;
            let bytes = connection(&frames);
            let expected = Seen {
                frames: count,
                control,
                last_stream,
            };
            let piece = (next() % 30 + 1) as usize;
            let mut split = ControlFrames::new(u32::MAX);
            for chunk in bytes.chunks(piece) {
                split.feed(chunk, || now).expect("no limit");
            }
            assert_eq!(split.seen(), expected, "in pieces of {piece}");
            let mut limited = ControlFrames::new(3);
            let mut refused = false;
            for chunk in bytes.chunks(piece) {
                refused |= limited.feed(chunk, || now).is_err();
            }
            assert_eq!(refused, control > 3);
            // cut short anywhere: never more than the whole, never a panic
            let cut = (next() as usize) % (bytes.len() + 1);
            let mut short = ControlFrames::new(u32::MAX);
            short.feed(&bytes[..cut], || now).expect("no limit");
            assert!(short.seen().frames <= count);
        }
    }

    #[test]
    fn goaway_is_a_well_formed_frame() {
        let f = goaway(9, ENHANCE_YOUR_CALM);
        assert_eq!(&f[..9], &[0, 0, 8, GOAWAY, 0, 0, 0, 0, 0]);
        assert_eq!(&f[9..], &[0, 0, 0, 9, 0, 0, 0, 0xb]);
    }
}
