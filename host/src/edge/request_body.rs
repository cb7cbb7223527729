//! A request's body as the guest gets it.
//!
//! The host reads the body before the guest runs (so a client that trickles it holds no
//! instance slot), within the body deadline and up to the size limit. A body over the limit is
//! not read further, and the host answers 413 before the guest runs: the contract puts the size
//! before every route's rules, so the host needs no knowledge of routes.
//!
//! Bodies held host-wide share one budget ([`BodyBuffers`]), of which the bodies of one peer
//! (one client address) may hold at most a [`PEER_SHARE`]th: a client that opens many
//! connections and stalls each half-way through its body fills its own share, not the room
//! every other client's request needs. A reserve keeps room for a small body of every client
//! while the shared part is full.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// The client broke the body's framing, or the connection.
    Unreadable,
    /// The body did not arrive within the body deadline.
    TooSlow,
    /// The bodies being held host-wide already fill their budget.
    NoRoom,
}

/// The part of the body budget one peer's bodies may hold together: one eighth.
pub const PEER_SHARE: usize = 8;

/// The largest body that is always read, from any client, while others hold the whole budget:
/// its buffer (at most twice its bytes) fits the reserve's place for one client.
pub const SMALL_BODY_BYTES: usize = 16 << 10;

/// How many clients at once the reserve holds a small body for: 8 MiB in all, or an eighth of a
/// smaller budget.
pub const RESERVED_SMALL_BODIES: usize = 256;

/// The bytes all request bodies together may hold in the host while they are read and until
/// their guest is done with them: with thousands of connections each allowed
/// `--max-body-bytes`, the per-body limit alone bounds nothing. Most of it is shared, each peer
/// holding at most a [`PEER_SHARE`]th; the rest is a reserve that only small bodies take,
/// one per peer, once the shared part has no room for them: eight peers can fill the shared
/// part, and a ninth still gets its small `POST` read.
pub struct BodyBuffers {
    shared: Pool,
    reserve: Pool,
}

/// Bytes that bodies hold, in all and by peer, within a limit for each.
struct Pool {
    limit: usize,
    /// The most the bodies of one peer may hold together.
    peer_limit: usize,
    held: AtomicUsize,
    /// What the bodies of each peer that holds any hold.
    by_peer: Mutex<HashMap<IpAddr, usize>>,
}

impl BodyBuffers {
    /// A budget of `limit` bytes: the reserve, and the shared part, a [`PEER_SHARE`]th of it
    /// for each peer, but never less than what one body of `max_body_bytes` may reserve (twice
    /// that: its buffer doubles).
    pub fn new(limit: usize, max_body_bytes: usize) -> Arc<BodyBuffers> {
        let small = 2 * SMALL_BODY_BYTES;
        // Never so large that the shared part cannot hold one peer's two largest buffers.
        let reserve = (RESERVED_SMALL_BODIES * small)
            .min(limit / PEER_SHARE)
            .min(limit.saturating_sub(max_body_bytes.saturating_mul(2)));
        let shared = limit - reserve;
        Arc::new(BodyBuffers {
            shared: Pool::new(
                shared,
                (shared / PEER_SHARE)
                    .max(max_body_bytes.saturating_mul(2))
                    .min(shared),
            ),
            reserve: Pool::new(reserve, small.min(reserve)),
        })
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.shared.held() + self.reserve.held()
    }
}

impl Pool {
    fn new(limit: usize, peer_limit: usize) -> Pool {
        Pool {
            limit,
            peer_limit,
            held: AtomicUsize::new(0),
            by_peer: Mutex::default(),
        }
    }

    /// Takes `more` bytes for `peer`, if its share and the whole pool have them.
    fn take(&self, peer: Option<IpAddr>, more: usize) -> bool {
        let mut by_peer = peer.map(|_| self.by_peer.lock().unwrap_or_else(PoisonError::into_inner));
        if let (Some(by_peer), Some(peer)) = (&by_peer, peer)
            && by_peer.get(&peer).copied().unwrap_or(0) + more > self.peer_limit
        {
            return false;
        }
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(more).filter(|sum| *sum <= self.limit)
            })
            .is_ok();
        if taken && let (Some(by_peer), Some(peer)) = (&mut by_peer, peer) {
            *by_peer.entry(peer).or_default() += more;
        }
        taken
    }

    /// Gives back `bytes` taken for `peer`.
    fn give_back(&self, peer: Option<IpAddr>, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.held.fetch_sub(bytes, Ordering::AcqRel);
        if let Some(peer) = peer {
            let mut by_peer = self.by_peer.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(held) = by_peer.get_mut(&peer) {
                *held -= bytes;
                if *held == 0 {
                    by_peer.remove(&peer);
                }
            }
        }
    }

    fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// Bytes of the [`BodyBuffers`] budget one body of one peer holds; given back when dropped.
#[derive(Default)]
pub struct Reservation {
    buffers: Option<Arc<BodyBuffers>>,
    /// The client's address, when the request came over a socket.
    peer: Option<IpAddr>,
    bytes: usize,
    /// Whether the bytes are the reserve's, not the shared part's.
    from_reserve: bool,
}

impl Reservation {
    /// Holds `total` bytes in all, if the budget and the peer's share have the difference;
    /// `false` if not. A body is held in the shared part while it has room, and in the reserve,
    /// whole, once it has not and the body is small; there it stays.
    fn grow_to(&mut self, total: usize) -> bool {
        let Some(buffers) = &self.buffers else {
            return true;
        };
        let more = total.saturating_sub(self.bytes);
        let taken = if self.from_reserve {
            buffers.reserve.take(self.peer, more)
        } else if buffers.shared.take(self.peer, more) {
            true
        } else if buffers.reserve.take(self.peer, total) {
            // Its first bytes may have found room in the shared part, its next ones not.
            buffers.shared.give_back(self.peer, self.bytes);
            self.bytes = 0;
            self.from_reserve = true;
            true
        } else {
            false
        };
        if taken {
            self.bytes = total.max(self.bytes);
        }
        taken
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(buffers) = &self.buffers {
            let pool = if self.from_reserve {
                &buffers.reserve
            } else {
                &buffers.shared
            };
            pool.give_back(self.peer, self.bytes);
        }
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reservation({} bytes)", self.bytes)
    }
}

/// A body the host has read: whole, or known to be over the limit (and left unread).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadBody {
    /// Every byte of it.
    Complete(Bytes),
    /// More than the limit: from `Content-Length` before reading anything, or while reading.
    OverLimit,
}

/// The whole body, or [`ReadBody::OverLimit`] as soon as it is known to exceed `limit`, with
/// the bytes of `buffers` it holds, counted in the share of `peer` (the client's address).
///
/// Each chunk is copied into one buffer as it arrives and its budget taken before the copy: a
/// body sent a byte at a time would otherwise pin one of hyper's 8 KiB read buffers per byte.
pub async fn read_body(
    mut body: Incoming,
    headers: &HeaderMap,
    limit: usize,
    buffers: &Arc<BodyBuffers>,
    peer: Option<IpAddr>,
) -> Result<(ReadBody, Reservation), BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Ok((ReadBody::OverLimit, Reservation::default()));
    }
    let mut reservation = Reservation {
        buffers: Some(Arc::clone(buffers)),
        peer,
        ..Reservation::default()
    };
    let mut collected = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| BodyError::Unreadable)?.into_data() else {
            continue; // Trailers: nothing for the guest.
        };
        let total = collected.len() + data.len();
        if total > limit {
            return Ok((ReadBody::OverLimit, Reservation::default()));
        }
        // The buffer at most doubles: reserve what it may become before it does.
        if total > collected.capacity() && !reservation.grow_to(total.max(2 * collected.len())) {
            return Err(BodyError::NoRoom);
        }
        collected.extend_from_slice(&data);
    }
    Ok((ReadBody::Complete(collected.freeze()), reservation))
}

/// The body handed to the guest: the bytes read, holding their share of the budget until the
/// guest is done with them.
#[derive(Debug)]
pub struct GuestRequestBody {
    bytes: Option<Bytes>,
    _reservation: Reservation,
}

impl GuestRequestBody {
    /// `bytes`, holding `reservation` while they live.
    pub fn new(bytes: Bytes, reservation: Reservation) -> GuestRequestBody {
        GuestRequestBody {
            bytes: Some(bytes),
            _reservation: reservation,
        }
    }
}

impl Body for GuestRequestBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(
            self.bytes
                .take()
                .filter(|bytes| !bytes.is_empty())
                .map(|bytes| Ok(Frame::data(bytes))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.as_ref().is_none_or(Bytes::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.bytes.as_ref().map_or(0, |bytes| bytes.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(buffers: &Arc<BodyBuffers>, peer: Option<[u8; 4]>) -> Reservation {
        Reservation {
            buffers: Some(Arc::clone(buffers)),
            peer: peer.map(IpAddr::from),
            ..Reservation::default()
        }
    }

    #[test]
    fn a_reservation_takes_only_what_the_budget_has_and_gives_it_back() {
        // 700 bytes shared, 100 reserved.
        let buffers = BodyBuffers::new(800, 350);
        let mut first = reservation(&buffers, None);
        assert!(first.grow_to(400));
        let mut second = reservation(&buffers, None);
        assert!(
            !second.grow_to(400),
            "over the shared part, and larger than the reserve"
        );
        assert!(second.grow_to(300));
        assert_eq!(buffers.held(), 700);
        drop(first);
        assert_eq!(buffers.held(), 300);
        drop(second);
        assert_eq!(buffers.held(), 0);
    }

    #[test]
    fn one_peers_bodies_fill_its_share_and_leave_the_rest_to_other_peers() {
        let buffers = BodyBuffers::new(800, 10);
        let attacker = Some([127, 0, 0, 2]);
        let mut stalled: Vec<_> = (0..20).map(|_| reservation(&buffers, attacker)).collect();
        let taken = stalled
            .iter_mut()
            .map(|body| body.grow_to(10))
            .filter(|&taken| taken)
            .count();
        // An eighth of the 700 shared bytes holds 8, the peer's place in the 100 reserved 10.
        assert_eq!(taken, 18);
        let mut fresh = reservation(&buffers, Some([127, 0, 0, 3]));
        assert!(fresh.grow_to(80));
        stalled.clear();
        assert_eq!(buffers.held(), 80);
        assert_eq!(
            buffers.shared.by_peer.lock().unwrap().len(),
            1,
            "no entry for a peer at 0"
        );
        assert!(buffers.reserve.by_peer.lock().unwrap().is_empty());
        assert!(reservation(&buffers, attacker).grow_to(80));
    }

    /// A body of `bytes` from `peer`, if the budget has room for it.
    fn body_of(buffers: &Arc<BodyBuffers>, peer: [u8; 4], bytes: usize) -> Option<Reservation> {
        let mut body = reservation(buffers, Some(peer));
        body.grow_to(bytes).then_some(body)
    }

    #[test]
    fn while_eight_peers_fill_the_shared_part_a_ninth_peers_small_body_is_read_from_the_reserve() {
        let buffers = BodyBuffers::new(64 << 20, 1 << 20);
        let mebibyte = 1 << 20;
        let crowd: Vec<_> = (1..=8)
            .flat_map(|peer| (0..8).map(move |_| [10, 0, 0, peer]))
            .filter_map(|peer| body_of(&buffers, peer, mebibyte))
            .collect();
        // 8 MiB is reserved; each peer fills its eighth of the 56 MiB shared, 7 bodies.
        assert_eq!(crowd.len(), 8 * 7);
        assert_eq!(buffers.shared.held(), 56 << 20);
        let small = 2 * SMALL_BODY_BYTES;
        let ninth = [10, 0, 0, 9];
        let kept = body_of(&buffers, ninth, small).expect("the ninth peer's small body is read");
        assert!(
            body_of(&buffers, ninth, mebibyte).is_none(),
            "a large one is not"
        );
        assert!(
            body_of(&buffers, ninth, small).is_none(),
            "nor a second small one at once"
        );
        // The reserve holds a small body for each of 256 peers, whoever they are.
        let others: Vec<_> = (1..RESERVED_SMALL_BODIES as u16)
            .filter_map(|n| body_of(&buffers, [10, 1, (n >> 8) as u8, n as u8], small))
            .collect();
        assert_eq!(others.len(), RESERVED_SMALL_BODIES - 1);
        assert!(
            body_of(&buffers, [10, 2, 0, 0], small).is_none(),
            "the reserve is full"
        );
        drop(kept);
        assert!(body_of(&buffers, [10, 2, 0, 0], small).is_some());
    }

    #[test]
    fn a_small_body_whose_next_bytes_find_the_shared_part_full_moves_to_the_reserve_whole() {
        let buffers = BodyBuffers::new(64 << 20, 1 << 20);
        let mut small = reservation(&buffers, Some([10, 0, 0, 9]));
        assert!(small.grow_to(100), "its first bytes, in the shared part");
        let mebibyte = 1 << 20;
        let mut crowd: Vec<_> = (1..=8)
            .flat_map(|peer| (0..7).map(move |_| [10, 0, 0, peer]))
            .filter_map(|peer| body_of(&buffers, peer, mebibyte))
            .collect();
        crowd.extend(body_of(&buffers, [10, 0, 0, 10], mebibyte - 100));
        assert_eq!(buffers.shared.held(), 56 << 20, "the shared part is full");
        assert!(small.grow_to(200), "its next bytes, in the reserve");
        assert_eq!(buffers.shared.held(), (56 << 20) - 100);
        assert_eq!(buffers.reserve.held(), 200);
        drop(small);
        assert_eq!(buffers.reserve.held(), 0);
        assert!(
            !reservation(&buffers, Some([10, 0, 0, 11])).grow_to(mebibyte),
            "a large body moves nowhere"
        );
    }

    #[test]
    fn the_reserve_never_keeps_the_largest_body_out_of_a_small_budget() {
        // A 30 MiB body in a 64 MiB budget: its buffer may reach 60 MiB.
        let buffers = BodyBuffers::new(64 << 20, 30 << 20);
        assert!(reservation(&buffers, Some([10, 0, 0, 1])).grow_to(60 << 20));
    }

    #[test]
    fn a_share_always_holds_one_whole_body() {
        let buffers = BodyBuffers::new(800, 300);
        assert!(reservation(&buffers, Some([10, 0, 0, 1])).grow_to(300));
    }

    #[tokio::test]
    async fn a_guest_body_is_its_bytes_and_gives_its_budget_back_when_dropped() {
        let buffers = BodyBuffers::new(100, 100);
        let mut held = reservation(&buffers, None);
        assert!(held.grow_to(2));
        let body = GuestRequestBody::new(Bytes::from("hi"), held);
        assert_eq!(buffers.held(), 2);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hi");
        assert_eq!(buffers.held(), 0);
    }
}
