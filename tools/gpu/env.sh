# Sourced by the GPU scripts, from the repository root on the device machine: unbuffered
# output, the carried wheels (deap, libcst: README of the device tool), the GPU's name, the
# toy weights, and $T, the target arguments every fitness command takes. The wheels and the
# weights are put in place once: a second script on the same host (one search per GPU) must
# not replace files under a running one.
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.carried ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && touch /tmp/site/.carried
fi
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -f target/weights/model.pt ] || python3 -m target.toy_weights > /dev/null
T="--model-config target/model_config.json --weight-dir target/weights --device cuda"
