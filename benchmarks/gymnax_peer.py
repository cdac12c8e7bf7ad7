"""gymnax's CartPole-v1 (JAX on the CPU) timed in its own venv, one repeat per line read from stdin.

Run by :mod:`benchmarks.tensor_peers` with the interpreter of ``make
bench-tensor``'s gymnax venv (JAX's pins clash with ours), so it imports
nothing of this repository. It builds the batched env once, compiles both
forms and warms them up, prints ``ready``, then for each line ``step`` or
``scan`` it reads times one repeat and prints its env-steps/s:

- ``step``: ``jit(vmap(env.step))`` called once per batch step from Python,
  as a training loop that steps then acts does;
- ``scan``: the whole repeat in one ``lax.scan``, gymnax's best form.

Both auto-reset (gymnax's step resets an ended env itself) and replay the
same pre-sampled random actions, ``(steps, num_envs)`` int32.

    .venv-gymnax/bin/python benchmarks/gymnax_peer.py --envs 65536 --steps 100
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    import gymnax
    import jax
    import jax.numpy as jnp

    env, params = gymnax.make("CartPole-v1")
    n, steps = args.envs, args.steps
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    actions = jax.random.randint(jax.random.PRNGKey(12345), (steps, n), 0, 2, dtype=jnp.int32)
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    # Each env's key folded with the step's number: fresh draws for its restarts every step, as a loop needs.
    fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))

    @jax.jit
    def one(keys: jax.Array, state: object, action: jax.Array, t: jax.Array) -> tuple[object, jax.Array]:
        obs, state, reward, terminated, truncated, _ = vstep(fold(keys, t), state, action, params)
        return state, obs

    @jax.jit
    def scan(keys: jax.Array, state: object, actions: jax.Array) -> tuple[object, jax.Array]:
        def body(carry: tuple[object, jax.Array], action: jax.Array) -> tuple[tuple[object, jax.Array], jax.Array]:
            state, t = carry
            obs, state, reward, terminated, truncated, _ = vstep(fold(keys, t), state, action, params)
            return (state, t + 1), reward.sum()

        (state, _), rewards = jax.lax.scan(body, (state, jnp.int32(0)), actions)
        return state, rewards

    for _ in range(2):  # compiled and warm
        state, out = one(keys, state, actions[0], 0)
        jax.block_until_ready(out)
        state, out = scan(keys, state, actions)
        jax.block_until_ready(out)
    print("ready", flush=True)
    for line in sys.stdin:
        form = line.strip()
        start = time.perf_counter()
        if form == "step":
            for t, row in enumerate(actions):
                state, out = one(keys, state, row, t)
            jax.block_until_ready(out)
        elif form == "scan":
            state, out = scan(keys, state, actions)
            jax.block_until_ready(out)
        else:
            break
        print(n * steps / (time.perf_counter() - start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
