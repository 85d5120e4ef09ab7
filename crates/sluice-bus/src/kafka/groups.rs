//! Committing and reading the offsets of any consumer group through one client.
//!
//! A librdkafka consumer commits only for the group it was made with (`group.id` is a
//! client setting), so committing for every deployment's group through consumers needs a
//! client per group, each with its own threads (main, internal, and one per broker): a node
//! with 1,000 deployments held 1,000 of them. librdkafka's admin API has what a group's
//! offsets need for any group (`AlterConsumerGroupOffsets` and `ListConsumerGroupOffsets`,
//! an `OffsetCommit` and an `OffsetFetch` to the group's coordinator, as the consumers sent),
//! but `rdkafka` 0.39 does not wrap them, so they are called here through `rdkafka-sys` on
//! the log's admin client. A commit needs the group to have no active members, which holds
//! for Sluice's groups: its readers are assigned partitions and never join them.
//!
//! The one module of `sluice-bus` that may use `unsafe` (the crate denies it). What every
//! block relies on:
//! - The admin client outlives every call made with its handle: [`GroupOffsets`] and its
//!   result thread each hold it, and the thread destroys the result queue before letting it go.
//! - Requests are copied by librdkafka when made (`rd_kafka_AlterConsumerGroupOffsets` and
//!   `rd_kafka_ListConsumerGroupOffsets` keep copies of the group and the partitions), so
//!   what is passed is freed right after the call.
//! - A result event is read only while it is held, and destroyed once; the group results and
//!   partition lists read from it belong to it, and are copied into Rust values first.
//! - The request's opaque is a number, never a pointer: a result that comes after its
//!   caller gave up finds no waiter and is dropped.
//!
//! Requests never time out inside librdkafka (see [`LIBRDKAFKA_PATIENCE`]): librdkafka
//! 2.12 aborts the process when a coordinator request times out while it still waits for
//! the group's coordinator, and the coordinator then comes back (the request's reference is
//! dropped twice: `rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0'`,
//! confluentinc/librdkafka issue 4605). A caller stops waiting after its own timeout; its
//! request stays in librdkafka until the broker answers it, and at most
//! [`MOST_IN_FLIGHT`] may. A commit its caller gave up on may so land after a later one of
//! the same group, moving the group's offsets back: records are delivered again, never lost.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rdsys;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::sync::oneshot;

use super::Context;

/// How long the result thread waits for a result before it checks whether the log is gone.
const POLL_MS: i32 = 200;
/// Tries per request when the failure is worth retrying ([`worth_retrying`]).
const ATTEMPTS: u32 = 3;
/// The wait before the second try (twice that before the third).
const RETRY_AFTER: Duration = Duration::from_millis(50);
/// How long librdkafka keeps a request to a group's coordinator before it gives up on it:
/// the longest it takes, an hour. A request that times out while waiting for its
/// coordinator aborts the process when the coordinator comes back (see the module's notes),
/// so no request should time out in librdkafka in any outage this side of an hour.
pub(super) const LIBRDKAFKA_PATIENCE: Duration = Duration::from_secs(3_600);
const LIBRDKAFKA_PATIENCE_MS: i32 = LIBRDKAFKA_PATIENCE.as_millis() as i32;
/// The most requests inside librdkafka at once. While the broker is away they wait there
/// (an hour at most); past this many, a request fails at once as the broker's queue being
/// full, so an outage does not pile up requests without end.
const MOST_IN_FLIGHT: usize = 4_096;

/// Committed offsets of one topic, by partition, as librdkafka answers them (`-1`: none).
pub(super) type Offsets = Vec<(i32, i64)>;

/// One partition of a group result: its partition, offset and error.
type Answer = (i32, i64, RDKafkaErrorCode);

type Outcome = Result<Vec<Answer>, KafkaError>;

/// Commits and reads group offsets through the admin client; results come back on a queue of
/// its own, served by one thread.
pub(super) struct GroupOffsets {
    /// Declared (so dropped) before `admin`: the queue goes before the client it belongs to.
    queue: Arc<Queue>,
    admin: Arc<AdminClient<Context>>,
    waiting: Arc<Mutex<HashMap<usize, oneshot::Sender<Outcome>>>>,
    /// Requests sent and not yet answered by librdkafka, whether or not anyone still waits.
    in_flight: Arc<AtomicUsize>,
    next: AtomicUsize,
    stop: Arc<AtomicBool>,
}

/// A librdkafka queue handle.
struct Queue(NonNull<rdsys::rd_kafka_queue_t>);

// SAFETY: librdkafka's queues are thread-safe (every operation takes the queue's lock); the
// handle is only destroyed by its last owner.
unsafe impl Send for Queue {}
// SAFETY: as for `Send`.
unsafe impl Sync for Queue {}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the handle came from `rd_kafka_queue_new` and is destroyed once, here; the
        // client it belongs to is still alive (see the module's notes).
        unsafe { rdsys::rd_kafka_queue_destroy(self.0.as_ptr()) }
    }
}

impl GroupOffsets {
    /// Starts the result thread.
    ///
    /// # Errors
    /// The thread could not start.
    pub(super) fn start(admin: Arc<AdminClient<Context>>) -> std::io::Result<Self> {
        // SAFETY: the client handle is valid while `admin` is held.
        let queue = unsafe { rdsys::rd_kafka_queue_new(admin.inner().native_ptr()) };
        let queue =
            Arc::new(Queue(NonNull::new(queue).ok_or_else(|| {
                std::io::Error::other("librdkafka made no queue for group offsets")
            })?));
        let waiting: Arc<Mutex<HashMap<usize, oneshot::Sender<Outcome>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let results = ResultThread {
            admin: admin.clone(),
            queue: queue.clone(),
            waiting: waiting.clone(),
            in_flight: in_flight.clone(),
            stop: stop.clone(),
        };
        std::thread::Builder::new()
            .name("kafka-offsets".to_owned())
            .spawn(move || results.run())?;
        Ok(Self { queue, admin, waiting, in_flight, next: AtomicUsize::new(1), stop })
    }

    /// Stores `offsets` (topic, partition, offset) as `group`'s committed offsets.
    pub(super) async fn commit(
        &self,
        group: &str,
        offsets: &[(&str, i32, i64)],
        timeout: Duration,
    ) -> Result<(), KafkaError> {
        let mut attempt = 1;
        loop {
            let (id, answer) = self.alter(group, offsets)?;
            let failed = match self.wait(id, answer, timeout).await {
                Ok(partitions) => partitions
                    .into_iter()
                    .map(|(_, _, code)| code)
                    .find(|code| *code != RDKafkaErrorCode::NoError)
                    .map(KafkaError::AdminOp),
                Err(error) => Some(error),
            };
            match failed {
                None => return Ok(()),
                Some(error) if attempt < ATTEMPTS && worth_retrying(&error) => {
                    tracing::debug!(%error, attempt, "committing group offsets again");
                    tokio::time::sleep(RETRY_AFTER * attempt).await;
                    attempt += 1;
                }
                Some(error) => return Err(error),
            }
        }
    }

    /// Sends an `AlterConsumerGroupOffsets` request; its result will come on the receiver.
    fn alter(
        &self,
        group: &str,
        offsets: &[(&str, i32, i64)],
    ) -> Result<(usize, oneshot::Receiver<Outcome>), KafkaError> {
        let group = CString::new(group).map_err(|_| invalid_argument())?;
        let list = PartitionList::new(offsets)?;
        let (id, answer) = self.expect_result()?;
        // SAFETY: the client, the queue and the list are alive for the call, and librdkafka
        // copies the request (see the module's notes); the request and its options are freed
        // once, after the call.
        unsafe {
            let rk = self.admin.inner().native_ptr();
            let options = self.options(
                rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_ALTERCONSUMERGROUPOFFSETS,
                id,
            );
            let mut request =
                rdsys::rd_kafka_AlterConsumerGroupOffsets_new(group.as_ptr(), list.0.as_ptr());
            rdsys::rd_kafka_AlterConsumerGroupOffsets(
                rk,
                &mut request,
                1,
                options,
                self.queue.0.as_ptr(),
            );
            rdsys::rd_kafka_AlterConsumerGroupOffsets_destroy(request);
            rdsys::rd_kafka_AdminOptions_destroy(options);
        }
        Ok((id, answer))
    }

    /// `group`'s committed offsets of `partitions` of `topic` (`-1` where it committed none).
    pub(super) async fn committed(
        &self,
        group: &str,
        topic: &str,
        partitions: impl Iterator<Item = i32>,
        timeout: Duration,
    ) -> Result<Offsets, KafkaError> {
        let wanted: Vec<(&str, i32, i64)> = partitions.map(|p| (topic, p, -1)).collect();
        let mut attempt = 1;
        let answered = loop {
            let (id, answer) = self.list(group, &wanted)?;
            match self.wait(id, answer, timeout).await {
                Err(error) if attempt < ATTEMPTS && worth_retrying(&error) => {
                    tracing::debug!(%error, attempt, "reading group offsets again");
                    tokio::time::sleep(RETRY_AFTER * attempt).await;
                    attempt += 1;
                }
                answered => break answered?,
            }
        };
        let mut found = Vec::new();
        for (partition, offset, code) in answered {
            if code != RDKafkaErrorCode::NoError {
                return Err(KafkaError::AdminOp(code));
            }
            found.push((partition, offset));
        }
        Ok(found)
    }

    /// Sends a `ListConsumerGroupOffsets` request; its result will come on the receiver.
    fn list(
        &self,
        group: &str,
        wanted: &[(&str, i32, i64)],
    ) -> Result<(usize, oneshot::Receiver<Outcome>), KafkaError> {
        let group = CString::new(group).map_err(|_| invalid_argument())?;
        let list = PartitionList::new(wanted)?;
        let (id, answer) = self.expect_result()?;
        // SAFETY: as in `commit`.
        unsafe {
            let rk = self.admin.inner().native_ptr();
            let options = self.options(
                rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTCONSUMERGROUPOFFSETS,
                id,
            );
            let mut request =
                rdsys::rd_kafka_ListConsumerGroupOffsets_new(group.as_ptr(), list.0.as_ptr());
            rdsys::rd_kafka_ListConsumerGroupOffsets(
                rk,
                &mut request,
                1,
                options,
                self.queue.0.as_ptr(),
            );
            rdsys::rd_kafka_ListConsumerGroupOffsets_destroy(request);
            rdsys::rd_kafka_AdminOptions_destroy(options);
        }
        Ok((id, answer))
    }

    /// A request number and where its result will be sent, counted in flight until
    /// librdkafka answers it; a full queue while [`MOST_IN_FLIGHT`] wait.
    fn expect_result(&self) -> Result<(usize, oneshot::Receiver<Outcome>), KafkaError> {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= MOST_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(KafkaError::AdminOp(RDKafkaErrorCode::QueueFull));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        self.waiting.lock().expect("group offsets map mutex").insert(id, sender);
        Ok((id, receiver))
    }

    /// Admin options for `op` carrying the request number `id`.
    ///
    /// # Safety
    /// The caller destroys the options once, after the request that uses them.
    unsafe fn options(
        &self,
        op: rdsys::rd_kafka_admin_op_t,
        id: usize,
    ) -> *mut rdsys::rd_kafka_AdminOptions_t {
        let mut error = [0 as c_char; 256];
        // SAFETY: the client is alive; the error buffer is as long as said; the opaque is a
        // number librdkafka only hands back.
        unsafe {
            let options = rdsys::rd_kafka_AdminOptions_new(self.admin.inner().native_ptr(), op);
            // Fails only for a timeout out of range, which this is not; the default then holds.
            rdsys::rd_kafka_AdminOptions_set_request_timeout(
                options,
                LIBRDKAFKA_PATIENCE_MS,
                error.as_mut_ptr(),
                error.len(),
            );
            rdsys::rd_kafka_AdminOptions_set_opaque(options, id as *mut c_void);
            options
        }
    }

    /// The result of request `id`: the partitions of its group result, each with its error.
    async fn wait(
        &self,
        id: usize,
        answer: oneshot::Receiver<Outcome>,
        timeout: Duration,
    ) -> Outcome {
        // librdkafka keeps the request longer (see the module's notes).
        let answered = tokio::time::timeout(timeout, answer).await;
        self.waiting.lock().expect("group offsets map mutex").remove(&id);
        match answered {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(KafkaError::Canceled),
            Err(_) => Err(KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut)),
        }
    }
}

impl Drop for GroupOffsets {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Whether a failed request may succeed when sent again: the connection or the group's
/// coordinator failed (tansu 0.6 drops the connection on the first `OffsetCommit` of a group
/// deleted before, after storing the offsets; a consumer's commit retried that by itself).
fn worth_retrying(error: &KafkaError) -> bool {
    let code = match error {
        KafkaError::AdminOp(code) => Some(*code),
        other => other.rdkafka_error_code(),
    };
    matches!(
        code,
        Some(
            RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
        )
    )
}

fn invalid_argument() -> KafkaError {
    KafkaError::AdminOp(RDKafkaErrorCode::InvalidArgument)
}

/// A librdkafka partition list, freed when dropped.
struct PartitionList(NonNull<rdsys::rd_kafka_topic_partition_list_t>);

impl PartitionList {
    fn new(entries: &[(&str, i32, i64)]) -> Result<Self, KafkaError> {
        let topics = entries
            .iter()
            .map(|(topic, _, _)| CString::new(*topic).map_err(|_| invalid_argument()))
            .collect::<Result<Vec<_>, _>>()?;
        let size = i32::try_from(entries.len()).map_err(|_| invalid_argument())?;
        // SAFETY: a new list is owned by this value alone; each entry added is copied by
        // librdkafka (the topic name too), and the returned element pointer is valid until
        // the list is next changed.
        unsafe {
            let list = NonNull::new(rdsys::rd_kafka_topic_partition_list_new(size))
                .ok_or_else(invalid_argument)?;
            let list = Self(list);
            for ((_, partition, offset), topic) in entries.iter().zip(&topics) {
                let element = rdsys::rd_kafka_topic_partition_list_add(
                    list.0.as_ptr(),
                    topic.as_ptr(),
                    *partition,
                );
                (*element).offset = *offset;
            }
            Ok(list)
        }
    }
}

impl Drop for PartitionList {
    fn drop(&mut self) {
        // SAFETY: made by `rd_kafka_topic_partition_list_new` and owned by this value.
        unsafe { rdsys::rd_kafka_topic_partition_list_destroy(self.0.as_ptr()) }
    }
}

/// Serves the result queue until the log is gone.
struct ResultThread {
    admin: Arc<AdminClient<Context>>,
    queue: Arc<Queue>,
    waiting: Arc<Mutex<HashMap<usize, oneshot::Sender<Outcome>>>>,
    in_flight: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl ResultThread {
    fn run(self) {
        while !self.stop.load(Ordering::Relaxed) {
            // SAFETY: the queue is alive while this thread holds it.
            let event = unsafe { rdsys::rd_kafka_queue_poll(self.queue.0.as_ptr(), POLL_MS) };
            let Some(event) = NonNull::new(event) else { continue };
            // SAFETY: the event is held until it is destroyed, once, right after it is read.
            let (id, outcome) = unsafe {
                let read = read_result(event.as_ptr());
                rdsys::rd_kafka_event_destroy(event.as_ptr());
                read
            };
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            let waiter = self.waiting.lock().expect("group offsets map mutex").remove(&id);
            if let Some(waiter) = waiter {
                // The caller may have given up meanwhile.
                let _ = waiter.send(outcome);
            }
        }
        // The queue goes before the client it belongs to.
        let Self { admin, queue, .. } = self;
        drop(queue);
        drop(admin);
    }
}

/// The request number and outcome of an offsets result event.
///
/// # Safety
/// `event` is a live event taken from the queue.
unsafe fn read_result(event: *mut rdsys::rd_kafka_event_t) -> (usize, Outcome) {
    // SAFETY: the event is alive (the caller's promise); what it points to is read before it
    // is destroyed and copied into Rust values.
    unsafe {
        let id = rdsys::rd_kafka_event_opaque(event) as usize;
        let error = rdsys::rd_kafka_event_error(event);
        if error != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return (id, Err(KafkaError::AdminOp(error.into())));
        }
        let mut count = 0usize;
        let groups = match rdsys::rd_kafka_event_type(event) {
            rdsys::RD_KAFKA_EVENT_ALTERCONSUMERGROUPOFFSETS_RESULT => {
                let result = rdsys::rd_kafka_event_AlterConsumerGroupOffsets_result(event);
                rdsys::rd_kafka_AlterConsumerGroupOffsets_result_groups(result, &mut count)
            }
            rdsys::RD_KAFKA_EVENT_LISTCONSUMERGROUPOFFSETS_RESULT => {
                let result = rdsys::rd_kafka_event_ListConsumerGroupOffsets_result(event);
                rdsys::rd_kafka_ListConsumerGroupOffsets_result_groups(result, &mut count)
            }
            _ => return (id, Err(KafkaError::AdminOpCreation("unexpected event".to_owned()))),
        };
        if groups.is_null() || count == 0 {
            return (id, Err(KafkaError::AdminOp(RDKafkaErrorCode::Fail)));
        }
        // One group per request.
        let group = *groups;
        let failed = rdsys::rd_kafka_group_result_error(group);
        if !failed.is_null() {
            return (id, Err(KafkaError::AdminOp(rdsys::rd_kafka_error_code(failed).into())));
        }
        let list = rdsys::rd_kafka_group_result_partitions(group);
        let mut partitions = Vec::new();
        if !list.is_null() && (*list).cnt > 0 && !(*list).elems.is_null() {
            let elements = std::slice::from_raw_parts((*list).elems, (*list).cnt as usize);
            for element in elements {
                if element.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    let topic = CStr::from_ptr(element.topic).to_string_lossy();
                    tracing::debug!(%topic, partition = element.partition, error = ?element.err, "a partition's group offset failed");
                }
                partitions.push((element.partition, element.offset, element.err.into()));
            }
        }
        (id, Ok(partitions))
    }
}
