//! A time-bounded fuzzer for the request decoder and the dispatcher.
//!
//! It feeds random and mutated requests of every opcode through `dispatch` with a file system
//! that implements nothing, and checks the engine's invariants: no panic escapes, and every
//! request that has an answer gets exactly one (FORGET, BATCH_FORGET and INTERRUPT get none),
//! with a header whose length matches what was sent.
//!
//! Runs for LANEFS_FUZZ_SECONDS (default 2; CI sets more). LANEFS_FUZZ_SEED replays a run.

use std::io::IoSlice;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lanefs_fuse::Filesystem;
use lanefs_fuse::abi::{self, opcode};
use lanefs_fuse::dispatch::{Dispatched, dispatch};
use lanefs_fuse::reply::{QueueHandle, ReplySink};
use lanefs_fuse::request::WireFormat;
use lanefs_fuse::stats::QueueStats;
use zerocopy::IntoBytes;

struct Nothing;
impl Filesystem for Nothing {}

/// The replies sent, each as one byte string.
#[derive(Default, Clone)]
struct Capture(Arc<Mutex<Vec<Vec<u8>>>>);

impl ReplySink for Capture {
    fn send(&self, _token: u64, iov: &[IoSlice<'_>]) -> std::io::Result<()> {
        let reply = iov.iter().flat_map(|s| s.iter().copied()).collect();
        self.0.lock().unwrap().push(reply);
        Ok(())
    }
}

/// xorshift64*: deterministic from its seed, so a failure can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A plausible body: argument-struct-sized random bytes, then NUL-terminated names.
fn body(rng: &mut Rng) -> Vec<u8> {
    let mut body: Vec<u8> = (0..[0, 8, 16, 24, 40, 64, 88][rng.below(7) as usize])
        .map(|_| rng.next() as u8)
        .collect();
    // Keep sizes and counts small now and then, so that decoding gets past the checks.
    if body.len() >= 8 && rng.below(2) == 0 {
        body[..8].copy_from_slice(&rng.below(64).to_ne_bytes());
    }
    for _ in 0..rng.below(3) {
        let len = rng.below(12);
        body.extend((0..len).map(|_| b'a' + rng.below(26) as u8));
        if rng.below(8) != 0 {
            body.push(0);
        }
    }
    if rng.below(4) == 0 {
        body.extend((0..rng.below(300)).map(|_| rng.next() as u8));
    }
    body
}

#[test]
fn dispatch_answers_every_request_exactly_once() {
    let seconds: u64 = std::env::var("LANEFS_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let seed: u64 = std::env::var("LANEFS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("fuzzing for {seconds} s with LANEFS_FUZZ_SEED={seed}");
    let mut rng = Rng(seed);
    let capture = Capture::default();
    let queue = Arc::new(QueueHandle {
        sink: Box::new(capture.clone()),
        stats: QueueStats::new(0, None, None),
        offload: Arc::new(lanefs_fuse::offload::Offload::new(
            &lanefs_fuse::topology::Topology::single(1),
        )),
    });
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut words = vec![0u64; 1024];
    let mut runs = 0u64;
    while Instant::now() < deadline {
        runs += 1;
        let op = rng.below(opcode::COUNT as u64 + 8) as u32;
        let body = body(&mut rng);
        let mut header = abi::InHeader {
            len: (size_of::<abi::InHeader>() + body.len()) as u32,
            opcode: op,
            unique: rng.next() | 2,
            nodeid: rng.below(4),
            ..Default::default()
        };
        match rng.below(16) {
            0 => header.len = rng.below(200) as u32,
            1 => header.total_extlen = rng.below(8) as u16,
            _ => {}
        }
        let mut request = header.as_bytes().to_vec();
        request.extend_from_slice(&body);
        let cut = if rng.below(10) == 0 {
            rng.below(request.len() as u64 + 1) as usize
        } else {
            request.len()
        };
        let buf = &mut words.as_mut_bytes()[..cut];
        buf.copy_from_slice(&request[..cut]);
        let wire = WireFormat {
            setxattr_ext: rng.below(2) == 0,
        };
        capture.0.lock().unwrap().clear();
        let dispatched = dispatch(&Nothing, wire, buf, &queue, 0);

        let replies = std::mem::take(&mut *capture.0.lock().unwrap());
        let header_ok = cut >= size_of::<abi::InHeader>()
            && header.len as usize == cut
            && header.total_extlen as usize * 8 <= cut - size_of::<abi::InHeader>();
        let silent = [opcode::FORGET, opcode::BATCH_FORGET, opcode::INTERRUPT].contains(&op);
        for reply in &replies {
            let len = u32::from_ne_bytes(reply[..4].try_into().unwrap()) as usize;
            assert_eq!(len, reply.len(), "reply length (seed {seed}, run {runs})");
            let unique = u64::from_ne_bytes(reply[8..16].try_into().unwrap());
            assert_eq!(unique, header.unique, "seed {seed}, run {runs}");
        }
        if !header_ok {
            // Without a trustworthy header there is nobody to answer.
            assert!(replies.is_empty(), "seed {seed}, run {runs}");
        } else if silent && replies.is_empty() {
            // Decoded fine, and these take no answer.
        } else {
            assert_eq!(
                replies.len(),
                1,
                "{} got {} answers (seed {seed}, run {runs})",
                opcode::name(op),
                replies.len()
            );
        }
        // What dispatch says must match what happened: the io_uring transport recycles a
        // ring entry on this word.
        assert_eq!(
            dispatched != Dispatched::Silent,
            replies.len() == 1,
            "{} dispatched {dispatched:?} with {} answers (seed {seed}, run {runs})",
            opcode::name(op),
            replies.len()
        );
    }
    eprintln!("{runs} requests");
    assert!(runs > 1000);
}
