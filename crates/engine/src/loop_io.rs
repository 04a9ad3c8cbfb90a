//! What goes into and comes out of the stepwise loop, for checking it against a
//! reference rollout: a [`NoiseSource`] that replaces the session's generator with
//! supplied tensors, and a [`LatentSink`] that sees each block's clean latents on their
//! way to the decoder ([`LatentRecorder`] keeps them on the host).

use std::sync::Mutex;

use headroom_tensor::{DType, Device, Tensor};

use crate::error::{EngineError, Result};

/// Where a session's noise comes from.
#[derive(Debug, Clone, Default)]
pub enum NoiseSource {
    /// The session's seeded counter-based generator (`SessionRequest::seed`).
    #[default]
    Generator,
    /// Every tensor the loop draws, f32 `[blocks, steps, C, 3, h, w]`, in draw order
    /// (per block: the initial noise, then each re-noise), e.g. from a reference rollout.
    Supplied(Tensor),
}

/// Receives each block's clean latents `[1, C, 3, h, w]` as they go to the decoder.
pub trait LatentSink: Send + Sync + std::fmt::Debug {
    /// Called once per block, in block order, before the block is decoded.
    fn accept(&self, block: usize, latents: &Tensor) -> Result<()>;
}

impl NoiseSource {
    /// Refuses supplied noise whose shape is not the `expected` `[blocks, steps, C, 3, h,
    /// w]` of the request, naming it.
    pub(crate) fn check(&self, expected: [usize; 6]) -> Result<()> {
        let NoiseSource::Supplied(noise) = self else {
            return Ok(());
        };
        if noise.shape() != expected || noise.dtype() != DType::F32 {
            return Err(EngineError::request(
                "noise",
                format!(
                    "must be f32 [blocks, steps, C, 3, h, w] = {expected:?} for this request, got {:?} {:?}",
                    noise.dtype(),
                    noise.shape()
                ),
            ));
        }
        Ok(())
    }

    /// Supplied draw number `index` (block `index / steps`, draw `index % steps`) as
    /// `shape` on `device`; `None` when the session's generator draws.
    pub(crate) fn draw(
        &self,
        index: usize,
        shape: &[usize],
        device: &Device,
    ) -> Result<Option<Tensor>> {
        let NoiseSource::Supplied(all) = self else {
            return Ok(None);
        };
        let (blocks, steps) = (all.shape()[0], all.shape()[1]);
        let (block, draw) = (index / steps, index % steps);
        if block >= blocks {
            return Err(EngineError::request(
                "noise",
                format!("the supplied noise holds {blocks} blocks only"),
            ));
        }
        Ok(Some(
            all.narrow(0, block, 1)?
                .narrow(1, draw, 1)?
                .contiguous()?
                .reshape(shape)?
                .to_device(device)?,
        ))
    }
}

/// A [`LatentSink`] that keeps every block's latents as host f32 values.
#[derive(Debug, Default)]
pub struct LatentRecorder {
    blocks: Mutex<Vec<(Vec<usize>, Vec<f32>)>>,
}

impl LatentRecorder {
    /// Blocks recorded so far.
    pub fn len(&self) -> usize {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no block was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Block `i`'s latents as f32 values in `[C, 3, h, w]` order.
    pub fn block(&self, i: usize) -> Option<Vec<f32>> {
        let blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        blocks.get(i).map(|(_, v)| v.clone())
    }

    /// Every block's latents stacked as f32 `[blocks, C, 3, h, w]` on `device`.
    pub fn stacked(&self, device: &Device) -> Result<Tensor> {
        let blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let Some((shape, _)) = blocks.first() else {
            return Err(EngineError::request("latents", "no block was generated"));
        };
        let mut dims = vec![blocks.len()];
        dims.extend_from_slice(&shape[1..]);
        let values: Vec<f32> = blocks.iter().flat_map(|(_, v)| v.iter().copied()).collect();
        Ok(Tensor::from_slice(&values, &dims, device)?)
    }
}

impl LatentSink for LatentRecorder {
    fn accept(&self, block: usize, latents: &Tensor) -> Result<()> {
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        if block != blocks.len() {
            return Err(EngineError::request(
                "latents",
                format!("block {block} arrived after {} blocks", blocks.len()),
            ));
        }
        blocks.push((latents.shape().to_vec(), latents.to_f32_vec()?));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supplied_noise_is_drawn_block_by_block_then_draw_by_draw() {
        let dev = Device::cpu().unwrap();
        // [blocks 2, steps 3, C 1, 3, 1, 1]: element value = 10·block + draw.
        let values: Vec<f32> = (0..2)
            .flat_map(|b| (0..3).flat_map(move |k| [(10 * b + k) as f32; 3]))
            .collect();
        let all = Tensor::from_slice(&values, &[2, 3, 1, 3, 1, 1], &dev).unwrap();
        let source = NoiseSource::Supplied(all);
        let firsts: Vec<f32> = (0..6)
            .map(|i| {
                let t = source.draw(i, &[1, 1, 3, 1, 1], &dev).unwrap().unwrap();
                assert_eq!(t.shape(), [1, 1, 3, 1, 1]);
                t.to_vec::<f32>().unwrap()[0]
            })
            .collect();
        assert_eq!(firsts, [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
        assert!(source.draw(6, &[1, 1, 3, 1, 1], &dev).is_err());
        assert!(NoiseSource::Generator
            .draw(0, &[1], &dev)
            .unwrap()
            .is_none());
        let err = source.check([3, 3, 1, 3, 1, 1]).unwrap_err().to_string();
        assert!(err.contains("[3, 3, 1, 3, 1, 1]"), "{err}");
    }

    #[test]
    fn the_recorder_stacks_blocks_in_order_and_refuses_a_gap() {
        let dev = Device::cpu().unwrap();
        let rec = LatentRecorder::default();
        for b in 0..2 {
            let t = Tensor::full(&[1, 2, 3, 1, 1], b as f32, DType::F32, &dev).unwrap();
            rec.accept(b, &t).unwrap();
        }
        let stacked = rec.stacked(&dev).unwrap();
        assert_eq!(stacked.shape(), [2, 2, 3, 1, 1]);
        assert_eq!(stacked.to_vec::<f32>().unwrap()[6], 1.0);
        let t = Tensor::zeros(&[1, 2, 3, 1, 1], DType::F32, &dev).unwrap();
        assert!(rec.accept(5, &t).is_err());
        assert_eq!(rec.len(), 2);
    }
}
