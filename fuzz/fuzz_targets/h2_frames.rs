//! The HTTP/2 frame-header reader that counts a client's control frames below h2
//! (`nodewarden_webhook::server::frames::ControlFrames`): decrypted connection bytes from outside.
//!
//! Input: the first byte is the size of the pieces the bytes arrive in (0 reads as 1), the rest is
//! what a client sent, preface first. Invariants: no panic; the count is the same whether the
//! bytes arrive whole or in pieces, and the same as a plain walk over the frame headers; with a
//! limit of three control frames and a clock that stands still, the reader refuses exactly when
//! there are more than three.

#![no_main]

use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use nodewarden_webhook::server::frames::{
    ControlFrames, HEADER_LEN, HEADERS, PING, PREFACE_LEN, PRIORITY, SETTINGS, Seen,
};

/// The frame headers of `bytes` read directly: every whole header after the preface, each
/// payload skipped by its length.
fn walk(bytes: &[u8]) -> Seen {
    let mut seen = Seen::default();
    let mut at = PREFACE_LEN;
    while let Some(header) = bytes.get(at..at + HEADER_LEN) {
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let kind = header[3];
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        seen.frames += 1;
        if kind == HEADERS {
            seen.last_stream = seen.last_stream.max(stream);
        }
        if matches!(kind, SETTINGS | PING | PRIORITY) {
            seen.control += 1;
        }
        at += HEADER_LEN + length;
    }
    seen
}

fuzz_target!(|data: &[u8]| {
    let Some((&piece, bytes)) = data.split_first() else {
        return;
    };
    let piece = usize::from(piece).max(1);
    let now = Instant::now();

    let mut whole = ControlFrames::new(u32::MAX);
    whole.feed(bytes, || now).expect("no limit");
    let mut pieces = ControlFrames::new(u32::MAX);
    for chunk in bytes.chunks(piece) {
        pieces.feed(chunk, || now).expect("no limit");
    }
    let expected = walk(bytes);
    assert_eq!(whole.seen(), expected, "read whole");
    assert_eq!(pieces.seen(), expected, "read in pieces of {piece}");

    let mut limited = ControlFrames::new(3);
    let mut refused = false;
    for chunk in bytes.chunks(piece) {
        refused |= limited.feed(chunk, || now).is_err();
    }
    assert_eq!(refused, expected.control > 3, "{expected:?}");
});
