//! The instance slots: a budget for instances working towards their response head, and one for
//! instances streaming a body whose head has gone out.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::RequestError;

/// How long a request waits for a free instance slot before it is answered 503.
pub const SLOT_WAIT: Duration = Duration::from_secs(1);

/// The two budgets of instance slots. Every live instance holds one permit of one of them.
#[derive(Clone)]
pub(super) struct InstanceSlots {
    /// Instances that have not yet sent their response head.
    running: Arc<Semaphore>,
    /// Instances streaming a body whose head has gone out.
    streaming: Arc<Semaphore>,
}

/// The permit one instance holds: first for running, then, once its head is out, for streaming
/// if one is free (else it keeps the running one to the end).
pub(super) type InstancePermit = Arc<std::sync::Mutex<OwnedSemaphorePermit>>;

impl InstanceSlots {
    /// `running` slots for instances before their head, `streaming` for those after it.
    pub(super) fn new(running: u32, streaming: u32) -> InstanceSlots {
        InstanceSlots {
            running: Arc::new(Semaphore::new(running as usize)),
            streaming: Arc::new(Semaphore::new(streaming as usize)),
        }
    }

    /// Waits up to [`SLOT_WAIT`] for a running slot.
    pub(super) async fn acquire_running(&self) -> Result<InstancePermit, RequestError> {
        let permit = tokio::time::timeout(SLOT_WAIT, Arc::clone(&self.running).acquire_owned())
            .await
            .map_err(|_| RequestError::Busy)?
            .expect("the slot semaphores are never closed");
        Ok(Arc::new(std::sync::Mutex::new(permit)))
    }

    /// Moves an instance whose head has gone out from the running budget to the streaming one,
    /// freeing its running slot for a new request; a no-op when every streaming slot is taken.
    pub(super) fn start_streaming(&self, permit: &InstancePermit) {
        if let Ok(streaming) = Arc::clone(&self.streaming).try_acquire_owned() {
            let mut held = permit
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // The running permit is released here, the instance counted under streaming.
            *held = streaming;
        }
    }
}
