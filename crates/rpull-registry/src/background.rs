//! [`BackgroundVerifier`]: digest verification on a thread of its own, so the task that
//! receives a blob does not also hash it.

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::digest::{Digest, DigestVerifier, VerifyError};

/// Bytes gathered before they go to the hashing thread: one wake-up per MiB, not per chunk.
const BATCH_BYTES: usize = 1024 * 1024;
/// Batches queued for the hashing thread. When it falls behind, [`BackgroundVerifier::update`]
/// waits, which slows the download down: at most about `BATCH_DEPTH + 2` MiB are held per blob.
const BATCH_DEPTH: usize = 4;

/// A [`DigestVerifier`] whose hashing runs on the runtime's blocking pool.
///
/// Needs a Tokio runtime. Dropping it without [`finish`](Self::finish) stops the hashing once
/// the queued bytes are hashed.
#[derive(Debug)]
pub struct BackgroundVerifier {
    expected_size: Option<u64>,
    seen: u64,
    batch: Vec<Bytes>,
    batch_bytes: usize,
    sender: mpsc::Sender<Vec<Bytes>>,
    hashing: JoinHandle<DigestVerifier>,
}

impl BackgroundVerifier {
    /// Verifies against `expected`, and against `expected_size` when given.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn spawn(expected: &Digest, expected_size: Option<u64>) -> BackgroundVerifier {
        let (sender, mut batches) = mpsc::channel::<Vec<Bytes>>(BATCH_DEPTH);
        // The size is checked on the receiving side; the thread only hashes.
        let mut verifier = DigestVerifier::new(expected, None);
        let hashing = tokio::task::spawn_blocking(move || {
            while let Some(batch) = batches.blocking_recv() {
                for chunk in batch {
                    verifier.update(&chunk);
                }
            }
            verifier
        });
        BackgroundVerifier {
            expected_size,
            seen: 0,
            batch: Vec::new(),
            batch_bytes: 0,
            sender,
            hashing,
        }
    }

    /// Feeds the next bytes of the content (a reference-counted handle, not a copy). Waits
    /// only when the hashing thread is 4 batches (of 1 MiB) behind.
    pub async fn update(&mut self, chunk: Bytes) {
        self.seen += chunk.len() as u64;
        self.batch_bytes += chunk.len();
        self.batch.push(chunk);
        if self.batch_bytes >= BATCH_BYTES {
            self.send_batch().await;
        }
    }

    /// Bytes fed so far.
    pub fn bytes_seen(&self) -> u64 {
        self.seen
    }

    /// Whether more bytes were fed than the expected size (lets a caller stop early).
    pub fn overran(&self) -> bool {
        self.expected_size.is_some_and(|size| self.seen > size)
    }

    async fn send_batch(&mut self) {
        self.batch_bytes = 0;
        let batch = std::mem::take(&mut self.batch);
        // The receiver lives until the sender is dropped (a panic there is reported by
        // `finish`), so a failed send has nothing to report.
        let _ = self.sender.send(batch).await;
    }

    /// Checks the size first (cheaper to explain, and known without waiting for the hash),
    /// then waits for the hashing thread and checks the digest.
    pub async fn finish(mut self) -> Result<(), VerifyError> {
        if let Some(expected) = self.expected_size
            && expected != self.seen
        {
            return Err(VerifyError::SizeMismatch {
                expected,
                actual: self.seen,
            });
        }
        if !self.batch.is_empty() {
            self.send_batch().await;
        }
        let BackgroundVerifier {
            sender, hashing, ..
        } = self;
        drop(sender);
        match hashing.await {
            Ok(verifier) => verifier.finish(),
            // Hashing panics only on a bug in this crate or sha2, never on content.
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(data: &[u8], size: usize) -> Vec<Bytes> {
        data.chunks(size).map(Bytes::copy_from_slice).collect()
    }

    /// Content of several batches, fed in uneven chunks, verifies; one flipped byte anywhere
    /// does not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn verifies_across_batches() {
        let data: Vec<u8> = (0..5 * BATCH_BYTES + 12345)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let digest = Digest::sha256_of(&data);
        for size in [1000, 65536, BATCH_BYTES + 1] {
            let mut verifier = BackgroundVerifier::spawn(&digest, Some(data.len() as u64));
            for chunk in chunks(&data, size) {
                verifier.update(chunk).await;
            }
            assert_eq!(verifier.bytes_seen(), data.len() as u64);
            assert!(!verifier.overran());
            verifier.finish().await.expect("intact content verifies");
        }
        for at in [0, BATCH_BYTES - 1, BATCH_BYTES, data.len() - 1] {
            let mut bad = data.clone();
            bad[at] ^= 1;
            let mut verifier = BackgroundVerifier::spawn(&digest, Some(data.len() as u64));
            for chunk in chunks(&bad, 65536) {
                verifier.update(chunk).await;
            }
            match verifier.finish().await {
                Err(VerifyError::DigestMismatch { expected, actual }) => {
                    assert_eq!(expected, digest);
                    assert_eq!(actual, Digest::sha256_of(&bad));
                }
                other => panic!("byte {at} flipped: {other:?}"),
            }
        }
    }

    /// Short and long content fail on size, and the overrun is seen as soon as it happens.
    #[tokio::test]
    async fn size_is_checked_first() {
        let data = vec![7u8; 3000];
        let digest = Digest::sha256_of(&data);
        let mut short = BackgroundVerifier::spawn(&digest, Some(3000));
        short.update(Bytes::from(data[..2999].to_vec())).await;
        assert_eq!(
            short.finish().await,
            Err(VerifyError::SizeMismatch {
                expected: 3000,
                actual: 2999
            })
        );
        let mut long = BackgroundVerifier::spawn(&digest, Some(3000));
        long.update(Bytes::from(data.clone())).await;
        assert!(!long.overran());
        long.update(Bytes::from_static(b"x")).await;
        assert!(long.overran());
        assert_eq!(
            long.finish().await,
            Err(VerifyError::SizeMismatch {
                expected: 3000,
                actual: 3001
            })
        );
        // Without a size, only the digest counts; empty content is fine.
        let empty = BackgroundVerifier::spawn(&Digest::sha256_of(b""), None);
        empty.finish().await.expect("empty content verifies");
    }
}
