//! The codec of the `weft.wire.v1` service: prost messages, as with tonic's own codec,
//! but sized for batches of frames. Tonic's default starts each message in an 8 KiB
//! buffer that then doubles while prost copies 64 KiB GSO frames in, so a batch was
//! copied about twice on its way out; this one reserves the encoded length first (one
//! copy) and keeps bigger buffers on both sides.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Buffer each stream starts with, per direction.
const BUFFER_SIZE: usize = 64 * 1024;
/// Encoded messages are handed to HTTP/2 once this much is buffered (or nothing more
/// is ready): large enough that a batch of full-size frames goes out as one piece.
const YIELD_THRESHOLD: usize = 256 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
}

/// A [`Codec`] for prost messages that encodes each message into space reserved for
/// its exact length (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct WireCodec<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Default for WireCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for WireCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = WireEncoder<T>;
    type Decoder = WireDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        WireEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireDecoder(PhantomData)
    }
}

/// Encodes `T` into space reserved up front.
#[derive(Debug, Clone, Copy)]
pub struct WireEncoder<T>(PhantomData<fn(T)>);

impl<T: Message> Encoder for WireEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf).map_err(|e| Status::internal(format!("encoding: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        settings()
    }
}

/// Decodes `U`; `bytes` fields configured as `Bytes` share the receive buffer.
#[derive(Debug, Clone, Copy)]
pub struct WireDecoder<U>(PhantomData<fn() -> U>);

impl<U: Message + Default> Decoder for WireDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        settings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Frame, FrameBatch};
    use tonic::codec::{EncodeBody, Streaming};

    fn batch(seed: u8, frames: usize, len: usize) -> FrameBatch {
        FrameBatch {
            frames: (0..frames)
                .map(|i| Frame {
                    wire_id: u64::from(seed) << 32 | i as u64,
                    data: vec![seed ^ i as u8; len].into(),
                })
                .collect(),
        }
    }

    /// Batches of GSO-sized and tiny frames go through the encoder and decoder (as
    /// tonic drives them on a stream) unchanged and in order.
    #[tokio::test]
    async fn batches_round_trip_through_a_stream() {
        let sent = vec![batch(1, 3, 65_546), batch(2, 200, 74), batch(3, 1, 10), batch(4, 0, 0)];
        let body = EncodeBody::new_client(
            WireEncoder::<FrameBatch>(PhantomData),
            tokio_stream::iter(sent.clone().into_iter().map(Ok)),
            None,
            None,
        );
        let mut got = Streaming::new_request(WireDecoder::<FrameBatch>(PhantomData), body, None, Some(64 << 20));
        let mut received = Vec::new();
        while let Some(b) = got.message().await.unwrap() {
            received.push(b);
        }
        assert_eq!(received, sent);
    }
}
