//! The instance slots: a budget for requests whose instance works towards their response head,
//! and one for those streaming a body whose head has gone out. A fresh instance is its request's;
//! under reuse the request holds the slot, and each instance a place of its own among as many
//! as both budgets hold, so that instances stay within the pools.
//!
//! - **A peer waits behind its own.** When no running slot is free, one client address has at
//!   most [`PEER_WAITERS`] requests in the host's line; a free slot is taken at once.
//! - **A share of the streaming slots per peer.** One peer streams on at most half of them.
//! - **A head out is not running.** An instance whose head is out when no streaming slot is
//!   left keeps its running slot only until a request finds none free: that request stops the
//!   oldest such instance (its response cut short) and takes its slot.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::error::RequestError;

/// How long a request waits for a free instance slot before it is answered 503.
pub const SLOT_WAIT: Duration = Duration::from_secs(1);
/// How many requests of one peer wait in the host's line for a running slot at once; the rest
/// wait behind them, in the peer's own line.
pub const PEER_WAITERS: usize = 4;
/// The part of the streaming slots the instances of one peer may hold at once: a half.
pub const PEER_STREAMING_SHARE: u32 = 2;
/// How long an instance streams on a running slot before a waiting request may stop it: a short
/// answer, whose body follows its head at once (a 201 for a stored user), is never cut short,
/// while a client that does not read gives the slot back within this.
pub const OVERFLOW_GRACE: Duration = Duration::from_millis(50);

/// The two budgets of instance slots. Every live instance holds one permit of one of them.
#[derive(Clone)]
pub(super) struct InstanceSlots {
    /// Instances that have not yet sent their response head.
    running: Arc<Semaphore>,
    /// Instances streaming a body whose head has gone out.
    streaming: Arc<Semaphore>,
    /// Each peer's line and share.
    peers: Arc<Peers>,
    /// Instances whose head went out when no streaming slot was left to them, oldest first:
    /// each still holds a running slot, which a request that finds none free takes back.
    overflow: Arc<Mutex<VecDeque<(Instant, AbortHandle)>>>,
    /// Told when an instance joins `overflow` while requests wait in the host's line, so that
    /// one of them takes its slot.
    overflowed: Arc<Notify>,
    /// Requests waiting in the host's line for a running slot.
    waiting: Arc<AtomicUsize>,
    /// Reused instances, live or idle: as many as there are slots.
    instances: Arc<Semaphore>,
}

/// What one instance holds.
enum Slot {
    /// A running slot, for a request of `peer`.
    Running {
        _slot: OwnedSemaphorePermit,
        peer: Option<PeerRef>,
    },
    /// A streaming slot, and a place in its peer's share of them.
    Streaming {
        _slot: OwnedSemaphorePermit,
        _share: Option<(OwnedSemaphorePermit, PeerRef)>,
    },
}

/// The slot one instance holds: first a running one, then, once its head is out, a streaming
/// one if one is left to it (else the running one until it ends or a request takes it back).
#[derive(Clone)]
pub(super) struct InstancePermit(Arc<Mutex<Slot>>);

impl InstanceSlots {
    /// `running` slots for instances before their head, `streaming` for those after it.
    pub(super) fn new(running: u32, streaming: u32) -> InstanceSlots {
        InstanceSlots {
            running: Arc::new(Semaphore::new(running as usize)),
            streaming: Arc::new(Semaphore::new(streaming as usize)),
            peers: Arc::new(Peers {
                streaming_per_peer: (streaming / PEER_STREAMING_SHARE).max(1) as usize,
                shares: Mutex::default(),
            }),
            overflow: Arc::default(),
            overflowed: Arc::default(),
            waiting: Arc::default(),
            instances: Arc::new(Semaphore::new((running + streaming) as usize)),
        }
    }

    /// A place for one reused instance, for its whole life: a free one, or the first to come
    /// free within [`SLOT_WAIT`].
    pub(super) async fn acquire_instance(&self) -> Result<OwnedSemaphorePermit, RequestError> {
        wait(&self.instances, Instant::now() + SLOT_WAIT).await
    }

    /// A running slot for a request from `peer`: a free one at once; else, waiting in the
    /// peer's line, one taken back from the oldest instance streaming on a running slot (when
    /// the request comes, and whenever one more joins them while it waits) or the first to
    /// come free, all within [`SLOT_WAIT`].
    pub(super) async fn acquire_running(
        &self,
        peer: Option<IpAddr>,
    ) -> Result<InstancePermit, RequestError> {
        let peer = peer.map(|address| self.peers.of(address));
        let slot = match Arc::clone(&self.running).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                let mut recheck = self.stop_oldest_overflow();
                let deadline = Instant::now() + SLOT_WAIT;
                let _turn = match &peer {
                    Some(peer) => Some(wait(&peer.share.waiting, deadline).await?),
                    None => None,
                };
                // One place in the line, kept while instances are stopped for it.
                let _in_line = InLine::join(&self.waiting);
                let slot = Arc::clone(&self.running).acquire_owned();
                tokio::pin!(slot);
                let taken = tokio::time::timeout_at(deadline, async {
                    loop {
                        let due = recheck.unwrap_or(deadline);
                        tokio::select! {
                            biased;
                            slot = &mut slot => return slot,
                            () = self.overflowed.notified() => recheck = self.stop_oldest_overflow(),
                            () = tokio::time::sleep_until(due), if recheck.is_some() => {
                                recheck = self.stop_oldest_overflow();
                            }
                        }
                    }
                });
                taken
                    .await
                    .map_err(|_| RequestError::Busy)?
                    .expect("the slot semaphores are never closed")
            }
        };
        Ok(InstancePermit(Arc::new(Mutex::new(Slot::Running {
            _slot: slot,
            peer,
        }))))
    }

    /// Moves an instance whose head has gone out from the running budget to the streaming one,
    /// freeing its running slot for a new request. When no streaming slot is left to it (its
    /// peer's share, or all of them, taken), the instance (its task `instance`) keeps its
    /// running slot until a request needs it.
    pub(super) fn start_streaming(&self, permit: &InstancePermit, instance: AbortHandle) {
        let mut held = permit.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Slot::Running { peer, .. } = &mut *held else {
            return;
        };
        let place = match peer {
            Some(peer) => match Arc::clone(&peer.share.streaming).try_acquire_owned() {
                Ok(place) => Some(place),
                Err(_) => return self.overflow(instance),
            },
            None => None,
        };
        let Ok(slot) = Arc::clone(&self.streaming).try_acquire_owned() else {
            return self.overflow(instance);
        };
        let share = place.zip(peer.take());
        // The running slot is released here, the instance counted under streaming.
        *held = Slot::Streaming {
            _slot: slot,
            _share: share,
        };
    }

    /// Records `instance` as streaming on a running slot, which a request may take back.
    fn overflow(&self, instance: AbortHandle) {
        let mut overflow = self.overflow.lock().unwrap_or_else(PoisonError::into_inner);
        // Instances that ended by themselves hold nothing: at most one entry per running slot
        // is left.
        overflow.retain(|(_, instance)| !instance.is_finished());
        overflow.push_back((Instant::now(), instance));
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.overflowed.notify_one();
        }
    }

    /// Stops the oldest instance still streaming on a running slot once it has streamed for
    /// [`OVERFLOW_GRACE`]: its slot comes free as its task ends. Returns when to look again:
    /// when the oldest comes due, or a grace after a stop (for the next one); `None` when no
    /// instance streams on a running slot.
    fn stop_oldest_overflow(&self) -> Option<Instant> {
        let mut overflow = self.overflow.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((since, instance)) = overflow.front() {
            if instance.is_finished() {
                overflow.pop_front();
                continue;
            }
            let due = *since + OVERFLOW_GRACE;
            if Instant::now() < due {
                return Some(due);
            }
            instance.abort();
            overflow.pop_front();
            tracing::warn!(
                "an instance streaming on a running slot, no streaming slot being left to its \
                 client, was stopped for a new request; its response was cut short"
            );
            return Some(Instant::now() + OVERFLOW_GRACE);
        }
        None
    }
}

/// A request's place in the host's line, counted while it lasts.
struct InLine<'a>(&'a AtomicUsize);

impl<'a> InLine<'a> {
    fn join(waiting: &'a AtomicUsize) -> InLine<'a> {
        waiting.fetch_add(1, Ordering::AcqRel);
        InLine(waiting)
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A permit of `semaphore`, waiting until `deadline` at most.
async fn wait(
    semaphore: &Arc<Semaphore>,
    deadline: Instant,
) -> Result<OwnedSemaphorePermit, RequestError> {
    Ok(
        tokio::time::timeout_at(deadline, Arc::clone(semaphore).acquire_owned())
            .await
            .map_err(|_| RequestError::Busy)?
            .expect("the slot semaphores are never closed"),
    )
}

/// Each peer with requests in flight: its line and its share, dropped with its last request.
struct Peers {
    streaming_per_peer: usize,
    shares: Mutex<HashMap<IpAddr, Arc<PeerShare>>>,
}

/// One peer's line for running slots and share of streaming slots.
struct PeerShare {
    waiting: Arc<Semaphore>,
    streaming: Arc<Semaphore>,
}

impl Peers {
    /// The line and share of `peer`, made if it has none.
    fn of(self: &Arc<Self>, peer: IpAddr) -> PeerRef {
        let mut shares = self.shares.lock().unwrap_or_else(PoisonError::into_inner);
        let share = shares.entry(peer).or_insert_with(|| {
            Arc::new(PeerShare {
                waiting: Arc::new(Semaphore::new(PEER_WAITERS)),
                streaming: Arc::new(Semaphore::new(self.streaming_per_peer)),
            })
        });
        PeerRef {
            peers: Arc::clone(self),
            peer,
            share: Arc::clone(share),
        }
    }
}

/// One request's hold on its peer's line and share; the peer's entry goes with the last.
struct PeerRef {
    peers: Arc<Peers>,
    peer: IpAddr,
    share: Arc<PeerShare>,
}

impl Drop for PeerRef {
    fn drop(&mut self) {
        let mut shares = self
            .peers
            .shares
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The map's and this one: no other request of the peer is in flight.
        if Arc::strong_count(&self.share) == 2 {
            shares.remove(&self.peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that holds `permit` until it is stopped.
    fn holding(permit: &InstancePermit) -> tokio::task::JoinHandle<()> {
        let permit = permit.clone();
        tokio::spawn(async move {
            let _permit = permit;
            std::future::pending::<()>().await;
        })
    }

    #[tokio::test]
    async fn a_request_takes_back_the_running_slot_of_the_oldest_instance_past_its_head() {
        let slots = InstanceSlots::new(2, 0);
        let (first, second) = (
            slots.acquire_running(None).await.unwrap(),
            slots.acquire_running(None).await.unwrap(),
        );
        let (oldest, newer) = (holding(&first), holding(&second));
        slots.start_streaming(&first, oldest.abort_handle());
        slots.start_streaming(&second, newer.abort_handle());
        drop((first, second));
        let taken = tokio::time::timeout(Duration::from_millis(500), slots.acquire_running(None))
            .await
            .expect("a slot taken back at once");
        assert!(taken.is_ok());
        assert!(oldest.await.unwrap_err().is_cancelled());
        assert!(!newer.is_finished(), "only the oldest is stopped");
    }

    #[tokio::test]
    async fn an_instance_whose_head_just_went_out_finishes_its_answer_before_it_can_be_stopped() {
        let slots = InstanceSlots::new(1, 0);
        let permit = slots.acquire_running(None).await.unwrap();
        let instance = holding(&permit);
        slots.start_streaming(&permit, instance.abort_handle());
        drop(permit);
        let started = Instant::now();
        let waiting = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire_running(None).await.map(drop) })
        };
        tokio::time::sleep(OVERFLOW_GRACE / 2).await;
        assert!(!instance.is_finished(), "stopped within its grace");
        waiting
            .await
            .unwrap()
            .expect("the slot, once the grace is over");
        assert!(started.elapsed() >= OVERFLOW_GRACE);
        assert!(instance.await.unwrap_err().is_cancelled());
    }

    #[tokio::test]
    async fn a_waiting_request_takes_the_slot_of_an_instance_that_sends_its_head_meanwhile() {
        let slots = InstanceSlots::new(1, 0);
        let permit = slots.acquire_running(None).await.unwrap();
        let instance = holding(&permit);
        let waiting = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire_running(None).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The head goes out, with no streaming slot to move to.
        slots.start_streaming(&permit, instance.abort_handle());
        drop(permit);
        tokio::time::timeout(Duration::from_millis(500), waiting)
            .await
            .expect("served without waiting for the instance to end")
            .unwrap()
            .unwrap();
        assert!(instance.await.unwrap_err().is_cancelled());
    }

    #[tokio::test]
    async fn an_instance_before_its_head_keeps_its_slot_and_a_request_gets_busy() {
        let slots = InstanceSlots::new(1, 1);
        let permit = slots.acquire_running(None).await.unwrap();
        let running = holding(&permit);
        assert!(matches!(
            slots.acquire_running(None).await,
            Err(RequestError::Busy)
        ));
        assert!(!running.is_finished());
    }

    #[tokio::test]
    async fn an_instance_past_its_head_with_a_streaming_slot_frees_its_running_one() {
        let slots = InstanceSlots::new(1, 1);
        let permit = slots.acquire_running(None).await.unwrap();
        let streaming = holding(&permit);
        slots.start_streaming(&permit, streaming.abort_handle());
        assert!(slots.acquire_running(None).await.is_ok());
        assert!(!streaming.is_finished(), "nothing was stopped");
    }

    #[tokio::test]
    async fn a_peers_crowd_waits_behind_its_own_and_another_peers_request_goes_first() {
        let slots = InstanceSlots::new(1, 0);
        let crowd = Some(IpAddr::from([127, 0, 0, 2]));
        let first = slots.acquire_running(crowd).await.unwrap();
        // The crowd's next requests: a few in the host's line, the rest in the peer's own.
        let waiting: Vec<_> = (0..2 * PEER_WAITERS)
            .map(|_| {
                let slots = slots.clone();
                tokio::spawn(async move { slots.acquire_running(crowd).await.map(drop) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let fresh = {
            let slots = slots.clone();
            tokio::spawn(async move {
                slots
                    .acquire_running(Some(IpAddr::from([127, 0, 0, 3])))
                    .await
                    .map(drop)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Each slot that comes free goes to the next in the host's line: the fresh request
        // stands behind at most PEER_WAITERS of the crowd.
        drop(first);
        let started = std::time::Instant::now();
        fresh.await.unwrap().unwrap();
        assert!(started.elapsed() < Duration::from_millis(500));
        for request in waiting {
            let _ = request.await.unwrap();
        }
        assert!(
            slots.peers.shares.lock().unwrap().is_empty(),
            "no entry is kept for a peer with nothing in flight"
        );
    }

    #[tokio::test]
    async fn one_peer_streams_on_half_the_streaming_slots_then_keeps_its_running_one() {
        let slots = InstanceSlots::new(4, 2);
        let crowd = Some(IpAddr::from([127, 0, 0, 2]));
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let permit = slots.acquire_running(crowd).await.unwrap();
            let task = holding(&permit);
            slots.start_streaming(&permit, task.abort_handle());
            tasks.push(task);
        }
        assert_eq!(
            slots.streaming.available_permits(),
            1,
            "one of two for the crowd"
        );
        assert_eq!(slots.running.available_permits(), 3);
        let other = slots
            .acquire_running(Some(IpAddr::from([127, 0, 0, 3])))
            .await
            .unwrap();
        let task = holding(&other);
        slots.start_streaming(&other, task.abort_handle());
        assert_eq!(
            slots.streaming.available_permits(),
            0,
            "the other peer's share"
        );
    }
}
