#!/usr/bin/env python3
"""Oracle for FlowMatchEulerDiscreteScheduler: schedules as FluxPipeline sets them and a few Euler steps.

Writes OUT/<config>/scheduler_config.json (save_config) and OUT/cases.json. float32 values are stored as
their IEEE bit patterns (uint32) so the C++ test can require bit equality."""
import argparse
import json
import pathlib

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

CONFIGS = {
    # FLUX.1-dev's scheduler_config.json.
    "flux_dev": dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                     max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096),
    # FLUX.1-schnell's: no dynamic shifting, shift 1.
    "flux_schnell": dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False, base_shift=0.5,
                         max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096),
    "static_shift_3": dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False),
    "linear_time_shift": dict(num_train_timesteps=1000, use_dynamic_shifting=True, time_shift_type="linear",
                              base_shift=0.3, max_shift=1.4, base_image_seq_len=64, max_image_seq_len=1024),
    "inverted_static": dict(num_train_timesteps=500, shift=2.5, use_dynamic_shifting=False, invert_sigmas=True),
}
STEPS = [1, 2, 4, 7, 28, 50]
# (height, width) of the image; FLUX packs (H/16)*(W/16) latent tokens.
SIZES = [(256, 256), (512, 768), (1024, 1024), (1360, 768), (2048, 2048)]
CUSTOM_SIGMAS = [[1.0, 0.75, 0.5, 0.25], [0.9, 0.61, 0.3333333333333333, 0.07, 0.001], [1.0]]


def bits(values) -> list:
    array = np.ascontiguousarray(np.asarray(values, dtype=np.float32))
    return array.view(np.uint32).tolist()


def tensor_bits(tensor: torch.Tensor) -> list:
    return bits(tensor.detach().to(torch.float32).flatten().numpy())


def schedule(scheduler, **kwargs) -> dict:
    scheduler.set_timesteps(**kwargs)
    return {"timesteps": bits(scheduler.timesteps.numpy()), "sigmas": bits(scheduler.sigmas.numpy())}


def config_cases(name: str, scheduler) -> list:
    config = scheduler.config
    cases = []
    for steps in STEPS:
        for height, width in SIZES:
            seq_len = (height // 16) * (width // 16)
            mu = calculate_shift(seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                                 config.get("base_shift", 0.5), config.get("max_shift", 1.15))
            sigmas = np.linspace(1.0, 1 / steps, steps)  # exactly FluxPipeline.__call__'s default
            case = {"config": name, "mode": "pipeline", "steps": steps, "image_seq_len": seq_len, "mu": mu,
                    "default_sigmas": sigmas.tolist()}
            case.update(schedule(scheduler, sigmas=sigmas, mu=mu))
            cases.append(case)
        mu = 0.8 if config.use_dynamic_shifting else None
        case = {"config": name, "mode": "num_steps", "steps": steps, "mu": mu}
        case.update(schedule(scheduler, num_inference_steps=steps, mu=mu))
        cases.append(case)
    for sigmas in CUSTOM_SIGMAS:
        mu = 1.05 if config.use_dynamic_shifting else None
        case = {"config": name, "mode": "custom_sigmas", "custom_sigmas": sigmas, "mu": mu}
        case.update(schedule(scheduler, sigmas=sigmas, mu=mu))
        cases.append(case)
    return cases


def euler_cases(scheduler, name: str) -> list:
    """A few Euler steps on random data, in float32 and bfloat16, after a FLUX-style schedule."""
    generator = torch.Generator().manual_seed(1234)
    cases = []
    steps = 4
    mu = calculate_shift(1024) if scheduler.config.use_dynamic_shifting else None
    for dtype in (torch.float32, torch.bfloat16):
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        sample = torch.randn(2, 8, 16, generator=generator).to(dtype)
        record = {"config": name, "dtype": str(dtype).replace("torch.", ""), "shape": list(sample.shape),
                  "mu": mu, "steps": steps, "initial": tensor_bits(sample), "model_outputs": [], "samples": []}
        for t in scheduler.timesteps:
            model_output = torch.randn(sample.shape, generator=generator).to(dtype)
            sample = scheduler.step(model_output, t, sample, return_dict=False)[0]
            assert sample.dtype == dtype
            record["model_outputs"].append(tensor_bits(model_output))
            record["samples"].append(tensor_bits(sample))
        cases.append(record)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    out = pathlib.Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    cases, steps = [], []
    for name, kwargs in CONFIGS.items():
        scheduler = FlowMatchEulerDiscreteScheduler(**kwargs)
        scheduler.save_config(out / name)
        cases += config_cases(name, scheduler)
        if name in ("flux_dev", "flux_schnell"):
            steps += euler_cases(scheduler, name)
    (out / "cases.json").write_text(json.dumps({"schedules": cases, "euler": steps}))
    print(f"scheduler: {len(cases)} schedules, {len(steps)} Euler runs")


if __name__ == "__main__":
    main()
