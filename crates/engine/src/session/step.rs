//! The block step machine: a block's DMD steps and commit, one transformer forward
//! at a time, so a scheduler can batch the forwards of several sessions.

use std::time::{Duration, Instant};

use headroom_model::dit::config::IMAGE_MASK_CHANNELS;
use headroom_model::dit::{BatchItem, KeyValues, TokenGrid};
use headroom_model::dmd::{guided_velocity, renoise, x0_from_velocity};
use headroom_model::kv::SessionKv;
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::{DType, Tensor};

use crate::cancel::Checkpoint;
use crate::condition::ImageCondition;
use crate::error::{EngineError, Result};

use super::Session;
use crate::blocks::BLOCK_FRAMES;

/// A block being denoised: its inputs and where its DMD loop stands.
#[derive(Debug)]
pub(crate) struct BlockRun {
    first: usize,
    past: Option<Vec<KeyValues>>,
    camera: Option<Tensor>,
    /// A still camera's tokens for the block, under camera guidance.
    still: Option<Tensor>,
    x: Tensor,
    x0: Tensor,
    /// The next forward: DMD step `k` while `k < steps`, then the commit.
    k: usize,
    /// The block's keys/values, once a forward gave them for the commit.
    own: Option<Vec<KeyValues>>,
    start: Instant,
    denoise: Duration,
}

/// The inputs of one transformer forward of a block.
#[derive(Debug)]
pub(crate) struct StepInput {
    tokens: Tensor,
    positions: Vec<[usize; 3]>,
    t: f32,
    grid: TokenGrid,
    /// The model input the tokens were embedded from, held through the forward.
    _input: Tensor,
}

/// A block's clean latents and how long they took.
#[derive(Debug)]
pub(crate) struct Denoised {
    pub(crate) x0: Tensor,
    pub(super) denoise: Duration,
    pub(super) commit: Duration,
}

impl Session {
    /// The next noise tensor the loop draws: supplied, or from the session's generator.
    fn noise(&mut self, shape: &[usize]) -> Result<Tensor> {
        if let Some(t) = self.noise_source.draw(self.draws, shape, &self.device)? {
            self.draws += 1;
            return Ok(t);
        }
        let t = Tensor::randn(
            shape,
            self.seed,
            self.noise_counter,
            DType::F32,
            &self.device,
        )?;
        self.noise_counter += t.numel() as u64;
        Ok(t)
    }

    /// The model input of block latents `x`: with the block's image condition appended
    /// for image-conditioned models.
    fn model_input(&self, x: &Tensor) -> Result<Tensor> {
        match self.cond.as_ref().and_then(ImageCondition::current) {
            Some(c) => Ok(Tensor::cat(&[x, c], 1)?),
            None => Ok(x.clone()),
        }
    }

    /// Starts block `n`: a prompt change takes effect, the block's image condition is
    /// encoded, its history gathered from the KV pages, its camera tokens and first
    /// noise drawn.
    pub(crate) fn begin_block(&mut self, n: usize) -> Result<BlockRun> {
        self.mid_block = true;
        self.advance_text()?;
        let first = BLOCK_FRAMES * n;
        let [h, w] = self.latent_hw;
        let out_c = self.dit.config().out_channels();
        let start = Instant::now();
        // This block's image condition, encoded as the block starts (the last block's
        // goes first, so one block's is held at a time).
        if let Some(cond) = self.cond.as_mut() {
            cond.advance(&self.vae, n)?;
        }
        let past = self
            .kv
            .as_ref()
            .map(SessionKv::gather)
            .transpose()?
            .flatten();
        let camera = self.camera_tokens(first)?;
        let still = match camera {
            Some(_) if self.camera_guidance != 1.0 => self.still_camera_tokens(first)?,
            _ => None,
        };
        let x = self.noise(&[1, out_c, BLOCK_FRAMES, h, w])?;
        Ok(BlockRun {
            first,
            past,
            camera,
            still,
            x0: x.clone(),
            x,
            k: 0,
            own: None,
            start,
            denoise: Duration::ZERO,
        })
    }

    /// The block's next transformer forward (a DMD step, then the commit at t = 0), or
    /// `None` once its keys/values are there; looks at the cancel token first.
    pub(crate) fn step_input(&self, run: &BlockRun) -> Result<Option<StepInput>> {
        if run.own.is_some() {
            return Ok(None);
        }
        let steps = self.schedule.len();
        let (x, t) = if run.k < steps {
            self.checkpoint(Checkpoint::DenoiseStep { step: run.k })?;
            (&run.x, self.schedule.timesteps[run.k])
        } else {
            self.checkpoint(Checkpoint::Commit)?;
            (&run.x0, 0.0)
        };
        let input = self.model_input(x)?;
        let grid = self.dit.grid(&input)?;
        let tokens = self.dit.embed(&input)?;
        Ok(Some(StepInput {
            positions: grid.positions(run.first),
            tokens,
            t,
            grid,
            _input: input,
        }))
    }

    /// This session's part of a forward: its text, history and camera tokens.
    pub(crate) fn batch_item<'a>(
        &'a self,
        run: &'a BlockRun,
        step: &'a StepInput,
    ) -> BatchItem<'a> {
        BatchItem {
            tokens: &step.tokens,
            positions: &step.positions,
            t: step.t,
            text: &self.text,
            past: run.past.as_deref(),
            camera: run.camera.as_ref(),
        }
    }

    /// Under camera guidance, the still camera's part of a DMD step's forward (the same
    /// tokens, history and text); `None` for the commit and without guidance.
    pub(crate) fn guided_item<'a>(
        &'a self,
        run: &'a BlockRun,
        step: &'a StepInput,
    ) -> Option<BatchItem<'a>> {
        let still = run.still.as_ref()?;
        (run.k < self.schedule.len()).then(|| BatchItem {
            camera: Some(still),
            ..self.batch_item(run, step)
        })
    }

    /// Takes the forward's velocity `v` and keys/values `own` (and the still camera's
    /// velocity under guidance): a DMD step's x0 and the next step's noisy latents, or
    /// the commit's keys/values.
    pub(crate) fn step_output(
        &mut self,
        run: &mut BlockRun,
        step: StepInput,
        v: Tensor,
        own: Vec<KeyValues>,
        still_v: Option<Tensor>,
    ) -> Result<()> {
        let steps = self.schedule.len();
        let k = run.k;
        run.k += 1;
        if k >= steps {
            run.own = Some(own);
            return Ok(());
        }
        if self.reuse_last_step_kv && k + 1 == steps {
            run.own = Some(own);
        } else {
            drop(own);
        }
        let v = match still_v {
            Some(still_v) => guided_velocity(&v, &still_v, self.camera_guidance)?,
            None => v,
        };
        let v = self.dit.unpatchify(&v, step.grid)?;
        drop(step);
        run.x0 = x0_from_velocity(&run.x, &v, self.schedule.sigmas[k])?;
        if run.first == 0 && self.dit.config().keep_first_frame {
            run.x0 = self.keep_given_frame(&run.x0)?;
        }
        if k + 1 < steps {
            let [h, w] = self.latent_hw;
            let out_c = self.dit.config().out_channels();
            let eps = self.noise(&[1, out_c, BLOCK_FRAMES, h, w])?;
            run.x = renoise(&run.x0, &eps, self.schedule.sigmas[k + 1])?;
        } else {
            run.x0.device().synchronize()?;
            run.denoise = run.start.elapsed();
            run.start = Instant::now();
        }
        Ok(())
    }

    /// Block 0's x0 with latent frame 0 replaced by the given image's latents (a model
    /// with `keep_first_frame`): every later step noises, and the commit keeps, the
    /// truth for the frame the session was given.
    fn keep_given_frame(&self, x0: &Tensor) -> Result<Tensor> {
        let Some(c) = self.cond.as_ref().and_then(ImageCondition::current) else {
            return Ok(x0.clone());
        };
        let [_, z, f, _, _] = *x0.shape() else {
            return Ok(x0.clone());
        };
        let given = c
            .narrow(1, IMAGE_MASK_CHANNELS, z)?
            .narrow(2, 0, 1)?
            .to_dtype(x0.dtype())?;
        Ok(Tensor::cat(&[&given, &x0.narrow(2, 1, f - 1)?], 2)?)
    }

    /// Commits the block's keys/values to the session's KV pages.
    pub(crate) fn finish_block(&mut self, run: BlockRun) -> Result<Denoised> {
        let BlockRun {
            first,
            past,
            camera,
            still,
            x0,
            own,
            start,
            denoise,
            ..
        } = run;
        drop(past);
        drop(camera);
        drop(still);
        let own = own.ok_or_else(|| {
            EngineError::Internal("the block ended before its keys/values".into())
        })?;
        if let Some(kv) = self.kv.as_mut() {
            kv.commit(first, &own)?;
        }
        drop(own);
        x0.device().synchronize()?;
        Ok(Denoised {
            x0,
            denoise,
            commit: start.elapsed(),
        })
    }

    /// The DMD steps of block `n` and its KV commit (the commit forward at t = 0, or the
    /// last step's keys/values when reusing them), one forward at a time.
    pub(super) fn denoise_block(&mut self, n: usize) -> Result<Denoised> {
        let mut run = self.begin_block(n)?;
        while let Some(step) = self.step_input(&run)? {
            let forward = |item: BatchItem| {
                self.dit.forward_tokens(
                    item.tokens,
                    item.positions,
                    item.t,
                    item.text,
                    item.past,
                    Mask::None,
                    item.camera,
                )
            };
            let (v, own) = forward(self.batch_item(&run, &step))?;
            let still_v = match self.guided_item(&run, &step) {
                Some(item) => Some(forward(item)?.0),
                None => None,
            };
            self.step_output(&mut run, step, v, own, still_v)?;
        }
        self.finish_block(run)
    }
}
