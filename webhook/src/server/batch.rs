//! Writes gathered into one TLS write per turn of a connection's task.
//!
//! hyper's HTTP/2 (h2 0.4) keeps a DATA frame of more than 256 bytes aside instead of copying it
//! into its buffer, and writes and flushes it before it buffers the next frame. Every admission
//! answer is larger than that, so without this each answer would be its own TLS record and its
//! own `writev`, even with many requests in flight on the connection.
//!
//! [`Batched`] sits between hyper and the TLS stream. Writes are copied into a buffer of at most
//! [`BATCH_LIMIT`] bytes, and a flush only marks the buffer as owed; the serving task writes it
//! out with [`WriteOut`] once the connection has done all it can this turn (its future returned
//! `Pending`). Answers that are ready together therefore leave together: one TLS record (up to
//! 16 KiB of plaintext), one system call. Nothing waits for more to arrive: the write-out happens
//! in the same turn as the flush, before the task sleeps.
//!
//! Bounds: the buffer never holds more than [`BATCH_LIMIT`] bytes (at the limit the buffer is
//! written out first, and a single write at least that large goes straight through), so a
//! connection holds at most that much beyond what hyper and rustls hold anyway. A failed
//! write-out is kept and returned to hyper by its next read, write or flush, which ends the
//! connection.
//!
//! Two checks ride on it because it sees every byte: [`WriteOut::stalled`] tells the serving
//! task whether bytes have been waiting to leave with no progress since it last asked (a client
//! that reads nothing), and an HTTP/2 connection's incoming frames are counted as they are read
//! ([`super::frames`]): past the control-frame allowance the read fails, which ends hyper's
//! connection, and [`WriteOut::calmed`] says why.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::frames::{ControlFrames, TooMany};

/// Most bytes kept back before they are written: one TLS record's plaintext.
pub const BATCH_LIMIT: usize = 16 * 1024;

struct State<T> {
    io: T,
    /// Bytes taken from hyper and not yet handed to `io`, from `sent` on.
    out: Vec<u8>,
    sent: usize,
    /// Something was handed to `io` (or is in `out`) and `io` has not been flushed since.
    dirty: bool,
    /// A write to `io` failed; hyper hears of it on its next call.
    failed: Option<(io::ErrorKind, String)>,
    /// Bytes handed to `io` and flushes done: progress, for [`WriteOut::stalled`].
    progress: u64,
    /// The incoming HTTP/2 frames' count, on an HTTP/2 connection.
    frames: Option<ControlFrames>,
    /// The client sent too many control frames; the read that saw it failed.
    calmed: Option<TooMany>,
}

impl<T: AsyncWrite + Unpin> State<T> {
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some((kind, message)) => Err(io::Error::new(*kind, message.clone())),
            None => Ok(()),
        }
    }

    /// Hands everything buffered to `io` and flushes it.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check()?;
        let result = ready!(self.poll_drain(cx));
        let result = match result {
            Ok(()) if self.dirty => ready!(Pin::new(&mut self.io).poll_flush(cx)),
            other => other,
        };
        match result {
            Ok(()) => {
                if self.dirty {
                    self.progress += 1;
                }
                self.dirty = false;
                Poll::Ready(Ok(()))
            }
            Err(err) => {
                self.failed = Some((err.kind(), err.to_string()));
                Poll::Ready(Err(err))
            }
        }
    }

    /// Hands everything buffered to `io`, without flushing it.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let rest = self.out.get(self.sent..).unwrap_or_default();
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
            self.progress = self.progress.wrapping_add(n as u64);
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    fn pending(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Takes `len` bytes (`copy` appends them) into the buffer, making room first when they
    /// would not fit. `None`: they are too large to buffer and go straight to `io`.
    fn poll_take(
        &mut self,
        cx: &mut Context<'_>,
        len: usize,
        copy: impl FnOnce(&mut Vec<u8>),
    ) -> Poll<io::Result<Option<usize>>> {
        self.check()?;
        if self.pending() + len > BATCH_LIMIT {
            ready!(self.poll_drain(cx))?;
        }
        self.dirty = true;
        if len >= BATCH_LIMIT {
            return Poll::Ready(Ok(None));
        }
        copy(&mut self.out);
        Poll::Ready(Ok(Some(len)))
    }
}

fn lock<T>(shared: &Mutex<State<T>>) -> MutexGuard<'_, State<T>> {
    // no code that can panic runs under the lock; a poisoned lock still holds consistent bytes
    shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The connection's side: what hyper reads from and writes to.
pub struct Batched<T> {
    shared: Arc<Mutex<State<T>>>,
}

/// The serving task's side: writes out what the connection left buffered.
pub struct WriteOut<T> {
    shared: Arc<Mutex<State<T>>>,
}

/// Wraps `io`; hyper gets the [`Batched`] side, the task that polls hyper's connection keeps the
/// [`WriteOut`] side and calls [`WriteOut::poll_write_out`] each time the connection returns
/// `Pending`. With `frames`, the incoming bytes are an HTTP/2 connection's and are counted.
pub fn batched<T>(io: T, frames: Option<ControlFrames>) -> (Batched<T>, WriteOut<T>) {
    let shared = Arc::new(Mutex::new(State {
        io,
        out: Vec::new(),
        sent: 0,
        dirty: false,
        failed: None,
        progress: 0,
        frames,
        calmed: None,
    }));
    (
        Batched {
            shared: shared.clone(),
        },
        WriteOut { shared },
    )
}

impl<T: AsyncWrite + Unpin> WriteOut<T> {
    /// Writes out and flushes what is buffered. `Pending` when the socket is full (the task is
    /// woken when it drains); an error is also kept for the connection to see.
    pub fn poll_write_out(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.shared).poll_write_out(cx)
    }

    /// Whether bytes are waiting to leave (buffered, or written and not yet flushed) and none
    /// have left since the last call, which passes in `seen` what it saw and gets it updated.
    /// Called at a fixed interval, `true` means nothing left for at least that long.
    pub fn stalled(&self, seen: &mut u64) -> bool {
        let state = lock(&self.shared);
        let owed = state.pending() > 0 || state.dirty;
        let stuck = owed && state.progress == *seen;
        *seen = state.progress;
        stuck
    }

    /// Why the connection's reading stopped, if it was for too many control frames, and the
    /// last stream the client opened (for the GOAWAY).
    pub fn calmed(&self) -> Option<(TooMany, u32)> {
        let state = lock(&self.shared);
        let last = state.frames.as_ref().map(|f| f.seen().last_stream).unwrap_or(0);
        state.calmed.map(|why| (why, last))
    }

    /// Queues `bytes` (a whole frame) after everything buffered, to leave with the next
    /// write-out.
    pub fn queue(&self, bytes: &[u8]) {
        let mut state = lock(&self.shared);
        state.out.extend_from_slice(bytes);
        state.dirty = true;
    }

    /// Writes out what is buffered and shuts the stream down.
    pub fn poll_close(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = lock(&self.shared);
        ready!(state.poll_write_out(cx))?;
        Pin::new(&mut state.io).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Batched<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut state = lock(&self.shared);
        state.check()?;
        let before = buf.filled().len();
        ready!(Pin::new(&mut state.io).poll_read(cx, buf))?;
        let state = &mut *state;
        if let Some(frames) = state.frames.as_mut() {
            let read = buf.filled().get(before..).unwrap_or_default();
            if let Err(too_many) = frames.feed(read, Instant::now) {
                state.calmed = Some(too_many);
                // a failed read hands over nothing
                buf.set_filled(before);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    too_many.to_string(),
                )));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Batched<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let mut state = lock(&self.shared);
        match ready!(state.poll_take(cx, buf.len(), |out| out.extend_from_slice(buf)))? {
            Some(n) => Poll::Ready(Ok(n)),
            None => Pin::new(&mut state.io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = bufs.iter().map(|b| b.len()).fold(0usize, usize::saturating_add);
        let mut state = lock(&self.shared);
        let copy = |out: &mut Vec<u8>| {
            out.reserve(len);
            for b in bufs {
                out.extend_from_slice(b);
            }
        };
        match ready!(state.poll_take(cx, len, copy))? {
            Some(n) => Poll::Ready(Ok(n)),
            None => Pin::new(&mut state.io).poll_write_vectored(cx, bufs),
        }
    }

    /// Vectored writes are copied in one call, so hyper may hand over a frame and its payload
    /// together.
    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Owed, not done: the serving task writes the buffer out at the end of the turn.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.shared).check().into()
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = lock(&self.shared);
        ready!(state.poll_write_out(cx))?;
        Pin::new(&mut state.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A stream that records each write it is given as one piece, and how often it is flushed.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        flushes: usize,
        fail: bool,
        input: Vec<u8>,
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = self.input.len().min(buf.remaining());
            let taken: Vec<u8> = self.input.drain(..n).collect();
            buf.put_slice(&taken);
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            if self.fail {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "peer gone")));
            }
            self.writes.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn recorded<R>(out: &WriteOut<Recorder>, f: impl FnOnce(&Recorder) -> R) -> R {
        f(&lock(&out.shared).io)
    }

    #[tokio::test]
    async fn answers_flushed_in_one_turn_leave_in_one_write() {
        let (mut conn, out) = batched(Recorder::default(), None);
        for answer in [&b"first answer"[..], b"second", b"third"] {
            conn.write_all(answer).await.expect("buffered");
            conn.flush().await.expect("flush is owed, not done");
        }
        assert_eq!(
            recorded(&out, |r| r.writes.len()),
            0,
            "nothing written before the turn ends"
        );
        poll_fn(|cx| out.poll_write_out(cx)).await.expect("written out");
        recorded(&out, |r| {
            assert_eq!(r.writes, vec![b"first answersecondthird".to_vec()]);
            assert_eq!(r.flushes, 1);
        });
        // nothing new: the next write-out writes and flushes nothing
        poll_fn(|cx| out.poll_write_out(cx)).await.expect("nothing to do");
        assert_eq!(recorded(&out, |r| (r.writes.len(), r.flushes)), (1, 1));
    }

    #[tokio::test]
    async fn vectored_pieces_are_kept_in_order() {
        let (mut conn, out) = batched(Recorder::default(), None);
        let pieces = [io::IoSlice::new(b"head "), io::IoSlice::new(b"body")];
        let n = poll_fn(|cx| Pin::new(&mut conn).poll_write_vectored(cx, &pieces))
            .await
            .expect("copied");
        assert_eq!(n, 9);
        conn.write_all(b" next").await.expect("buffered");
        poll_fn(|cx| out.poll_write_out(cx)).await.expect("written out");
        assert_eq!(recorded(&out, |r| r.writes.concat()), b"head body next".to_vec());
    }

    #[tokio::test]
    async fn the_buffer_never_holds_more_than_the_limit() {
        let (mut conn, out) = batched(Recorder::default(), None);
        let piece = vec![7u8; BATCH_LIMIT / 2 + 1];
        conn.write_all(&piece).await.expect("buffered");
        assert_eq!(recorded(&out, |r| r.writes.len()), 0);
        // a second half would overflow: the first goes out before it is taken
        conn.write_all(&piece).await.expect("buffered");
        assert_eq!(recorded(&out, |r| r.writes.clone()), vec![piece.clone()]);
        assert!(lock(&out.shared).pending() <= BATCH_LIMIT);
        // a write at least as large as the limit goes straight through, after what was buffered
        let large = vec![9u8; BATCH_LIMIT];
        conn.write_all(&large).await.expect("written through");
        recorded(&out, |r| {
            assert_eq!(r.writes.len(), 3);
            assert_eq!(r.writes[1], piece);
            assert_eq!(r.writes[2], large);
        });
        poll_fn(|cx| out.poll_write_out(cx)).await.expect("flushed");
        assert_eq!(
            recorded(&out, |r| r.flushes),
            1,
            "the direct write is flushed at the end of the turn"
        );
    }

    #[tokio::test]
    async fn shutdown_writes_out_what_is_left() {
        let (mut conn, out) = batched(Recorder::default(), None);
        conn.write_all(b"last answer").await.expect("buffered");
        conn.shutdown().await.expect("shut down");
        assert_eq!(recorded(&out, |r| r.writes.concat()), b"last answer".to_vec());
    }

    #[tokio::test]
    async fn a_failed_write_out_reaches_the_connection() {
        let (mut conn, out) = batched(Recorder::default(), None);
        conn.write_all(b"answer").await.expect("buffered");
        lock(&out.shared).io.fail = true;
        let err = poll_fn(|cx| out.poll_write_out(cx))
            .await
            .expect_err("the peer is gone");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        let mut byte = [0u8; 1];
        let read = conn
            .read(&mut byte)
            .await
            .expect_err("the read reports the failed write");
        assert_eq!(read.kind(), io::ErrorKind::BrokenPipe);
        assert!(
            conn.write_all(b"more").await.is_err(),
            "and so does the next write"
        );
    }

    #[tokio::test]
    async fn bytes_that_cannot_leave_are_a_stall_and_bytes_that_leave_are_not() {
        let (mut conn, out) = batched(Recorder::default(), None);
        let mut seen = 0;
        assert!(!out.stalled(&mut seen), "nothing owed");
        conn.write_all(b"answer").await.expect("buffered");
        assert!(out.stalled(&mut seen), "owed and nothing left since");
        assert!(out.stalled(&mut seen), "still");
        poll_fn(|cx| out.poll_write_out(cx)).await.expect("written out");
        assert!(!out.stalled(&mut seen), "written out");
        assert!(!out.stalled(&mut seen), "nothing owed");
    }

    #[tokio::test]
    async fn too_many_control_frames_fail_the_read_and_say_why() {
        use super::super::frames::{ENHANCE_YOUR_CALM, SETTINGS};
        let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        for _ in 0..5 {
            input.extend_from_slice(&[0, 0, 0, SETTINGS, 1, 0, 0, 0, 0]);
        }
        let (mut conn, out) = batched(
            Recorder {
                input,
                ..Recorder::default()
            },
            Some(ControlFrames::new(3)),
        );
        let mut all = Vec::new();
        let err = conn.read_to_end(&mut all).await.expect_err("too many");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let (why, last) = out.calmed().expect("calmed");
        assert_eq!((why.kind, last), (SETTINGS, 0));
        out.queue(&super::super::frames::goaway(last, ENHANCE_YOUR_CALM));
        poll_fn(|cx| out.poll_close(cx)).await.expect("closed");
        assert_eq!(
            recorded(&out, |r| r.writes.concat())[3],
            super::super::frames::GOAWAY
        );
    }

    #[tokio::test]
    async fn reads_pass_through() {
        let (mut conn, _out) = batched(
            Recorder {
                input: b"request".to_vec(),
                ..Recorder::default()
            },
            None,
        );
        let mut got = [0u8; 7];
        conn.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"request");
    }
}
