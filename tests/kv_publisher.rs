//! A stand-in for vLLM's and SGLang's KV event publishers: a ZeroMQ PUB socket sending
//! `[topic, 8-byte big-endian sequence, msgpack batch]` in either encoding, and a ROUTER replay
//! socket answering `[empty, start]` with every buffered batch from `start` and then sequence
//! −1, in vLLM's reply shape (`[empty, topic, seq, payload]`) or SGLang's (`[empty, seq,
//! payload]`). It can also lose batches (buffered for replay but never sent), start its
//! sequence over as a restarted engine does, and send garbage.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use ringmaster_kv_events::{Batch, Encoding, encode_batch};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// Whose replay reply shape to answer in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayShape {
    /// Newer vLLM: `[empty, topic, seq, payload]`, end `[empty, empty, -1, empty]`.
    VllmWithTopic,
    /// SGLang and older vLLM: `[empty, seq, payload]`, end `[empty, -1, empty]`.
    SglangWithoutTopic,
}

type Buffer = Arc<Mutex<VecDeque<(u64, Vec<u8>)>>>;

/// A publisher on loopback, replay socket included, until dropped.
pub struct KvPublisher {
    /// `tcp://127.0.0.1:PORT` of the PUB socket.
    pub endpoint: String,
    /// `tcp://127.0.0.1:PORT` of the replay socket.
    pub replay_endpoint: String,
    socket: zeromq::PubSocket,
    buffer: Buffer,
    capacity: usize,
    encoding: Encoding,
    topic: Vec<u8>,
    next: u64,
    replay: tokio::task::JoinHandle<()>,
}

impl KvPublisher {
    /// Binds both sockets on loopback; the replay buffer keeps the last `capacity` batches.
    pub async fn start(encoding: Encoding, shape: ReplayShape, capacity: usize) -> Self {
        let mut socket = zeromq::PubSocket::new();
        let endpoint = socket.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let mut router = zeromq::RouterSocket::new();
        let replay_endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let buffer: Buffer = Arc::default();
        let topic = b"kv-events".to_vec();
        let replay = tokio::spawn(serve_replay(router, buffer.clone(), shape, topic.clone()));
        Self {
            endpoint,
            replay_endpoint,
            socket,
            buffer,
            capacity,
            encoding,
            topic,
            next: 0,
            replay,
        }
    }

    /// The sequence the next batch gets.
    pub fn next_sequence(&self) -> u64 {
        self.next
    }

    fn take(&mut self, batch: &Batch) -> (u64, Vec<u8>) {
        let sequence = self.next;
        self.next += 1;
        let payload = encode_batch(batch, self.encoding);
        let mut buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        buffer.push_back((sequence, payload.clone()));
        while buffer.len() > self.capacity {
            buffer.pop_front();
        }
        (sequence, payload)
    }

    /// Publishes a batch; returns its sequence.
    pub async fn publish(&mut self, batch: &Batch) -> u64 {
        let (sequence, payload) = self.take(batch);
        self.send(vec![
            self.topic.clone(),
            sequence.to_be_bytes().to_vec(),
            payload,
        ])
        .await;
        sequence
    }

    /// Buffers a batch for replay without sending it: a batch lost on the way.
    pub fn lose(&mut self, batch: &Batch) -> u64 {
        self.take(batch).0
    }

    /// Sends any parts as one message (garbage, oversized batches).
    pub async fn send(&mut self, parts: Vec<Vec<u8>>) {
        let mut parts = parts.into_iter();
        let mut message = ZmqMessage::from(parts.next().unwrap_or_default());
        for part in parts {
            message.push_back(part.into());
        }
        self.socket.send(message).await.unwrap();
    }

    /// Starts over as a restarted engine does: sequence 0, empty buffer.
    pub fn restart(&mut self) {
        self.next = 0;
        self.buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

impl std::fmt::Debug for KvPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPublisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Drop for KvPublisher {
    fn drop(&mut self) {
        self.replay.abort();
    }
}

async fn serve_replay(
    mut router: zeromq::RouterSocket,
    buffer: Buffer,
    shape: ReplayShape,
    topic: Vec<u8>,
) {
    while let Ok(request) = router.recv().await {
        let parts: Vec<Vec<u8>> = request.iter().map(|b| b.to_vec()).collect();
        let [client, _empty, start] = &parts[..] else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(&start[..]) else {
            continue;
        };
        let start = u64::from_be_bytes(start);
        let held: Vec<(u64, Vec<u8>)> = buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        let reply = |seq: Vec<u8>, payload: Vec<u8>| {
            let mut parts = vec![client.clone(), Vec::new()];
            if shape == ReplayShape::VllmWithTopic {
                parts.push(if payload.is_empty() {
                    Vec::new()
                } else {
                    topic.clone()
                });
            }
            parts.push(seq);
            parts.push(payload);
            let mut parts = parts.into_iter();
            let mut message = ZmqMessage::from(parts.next().unwrap_or_default());
            for part in parts {
                message.push_back(part.into());
            }
            message
        };
        for (seq, payload) in held {
            if router
                .send(reply(seq.to_be_bytes().to_vec(), payload))
                .await
                .is_err()
            {
                break;
            }
        }
        let _ = router.send(reply(vec![0xff; 8], Vec::new())).await;
    }
}
