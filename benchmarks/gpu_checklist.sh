#!/usr/bin/env bash
# GPU.md's checklist in one go, on a machine with one CUDA GPU: each part's output in LOGS/.
#
#   bash benchmarks/gpu_checklist.sh LOGS [PEER]
#
# PEER: a self-critical.pytorch checkout with its cider submodule (the peer comparison is
# skipped without it). Each part has its own time limit (seconds, in the PART_* variables; 0
# skips the part) so that a slow one cannot take the others' time; a part that fails or runs
# out says so in its log and the next one runs. PEER_BEAM_IMAGES: the images beam search
# decodes in the peer comparison (GPU.md: 5,000). REHEARSAL_IMAGES: the made-up images the
# rehearsal of configs/coco.yaml runs on (1,000).
set -u
LOGS=${1:?usage: gpu_checklist.sh LOGS [PEER]}
PEER=${2:-}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
part() {  # part NAME SECONDS COMMAND...: run it under its limit, its output in LOGS/NAME.log
  local name=$1 limit=$2
  shift 2
  if [ "$limit" = 0 ]; then echo "== $name: skipped"; return; fi
  echo "== $name (limit ${limit}s): $*"
  local started=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "   rc $rc after $((SECONDS - started))s"
  tail -n 25 "$LOGS/$name.log"
}

part environment 60 bash -c 'nvidia-smi -L; python3 -c "import torch, torchvision;
print(torch.__version__, torchvision.__version__, torch.cuda.get_device_name())";
command -v java || echo "no java: METEOR and the PTB tokenizer cannot run here"'
# 1. correctness on CUDA
part cuda_tests "${PART_CUDA_TESTS:-120}" python3 -m pytest -q -m cuda -p no:cacheprovider
# 2. training throughput at COCO size: top_down hidden 1000 on 36x2048 regions, stack_cap on a
#    14x14x2048 grid, the Transformer; XE and SCST, bfloat16 on and off; store reads; the GPU's
#    busy share
part training "${PART_TRAINING:-150}" python3 benchmarks/training.py --device cuda --hidden 1000 \
  --scst --setups top_down:36:50,stack_cap:196:50,transformer:36:50 --steps "${TRAINING_STEPS:-10}" \
  --beam-images 1000 --beam-single 50
#    what each step asks of the GPU: operators, host syncs (each with its line), copies; the
#    aim: one sync an XE step, three an SCST step (its captions to the reward, the statistics)
part training_count "${PART_COUNT:-60}" python3 benchmarks/training.py --device cuda --count \
  --hidden 1000 --scst --setups top_down:36:50,stack_cap:196:50,transformer:36:50
#    the store reads in the training process (read ahead by a thread) against 4 reader
#    processes (data.readers: 4): XE steps, the data share of each
part training_readers "${PART_READERS:-90}" python3 benchmarks/training.py --device cuda \
  --hidden 1000 --setups top_down:36:50,stack_cap:196:50 --steps "${TRAINING_STEPS:-10}" \
  --readers 0,4 --beam-images 0
#    the steps with train.compile: steps (the decoder's recurrence and per-word step through
#    torch.compile, CUDA graphs) against eager: top_down XE and SCST at hidden 1000, 50 images
#    x 5 captions; the GPU busy share of each (eager 0.51 XE, 0.39 SCST; the aim is 0.8)
part training_compiled "${PART_COMPILED:-300}" python3 benchmarks/training.py --device cuda \
  --hidden 1000 --scst --setups top_down:36:50,transformer:36:50 --steps "${TRAINING_STEPS:-10}" \
  --compile off,steps --beam-images 0
# 3. and 4. against the peer on the same GPU: UpDown and the Transformer, XE and SCST steps,
#    beam K=5 on 5,000 images; capstack with train.compile: steps (PEER_COMPILE=off: eager)
if [ -n "$PEER" ]; then
  part peer "${PART_PEER:-180}" python3 benchmarks/peer_steps.py --peer "$PEER" --device cuda \
    --width 1000 --steps 5 --beam-images "${PEER_BEAM_IMAGES:-5000}" --beam-steps 1 \
    --models updown,transformer --compile "${PEER_COMPILE:-steps}"
fi
echo "== targets of training: top_down's XE step with the GPU busy >= 0.80 (training_compiled:"
echo "   'GPU busy'); against the peer (peer: 'capstack vs peer'): top_down XE >= 2x, SCST >= 4x,"
echo "   Transformer XE >= 2x, SCST >= 4x; bfloat16 faster than float32 for XE and SCST (training:"
echo "   'images/s', bf16 against fp32 rows); the store's reads < 5 % of a step (training_readers:"
echo "   'data share'; its first lines say whether the store fits in the page cache); one XE and"
echo "   one SCST epoch over 113,287 images (rehearsal: its projection beside real_data_needs.py)"
# 5. extraction: ResNet-101 grid at 448, the VG detector at 600x1000; GPU against CPU
#    over 1,000 images (the workers' start weighs little): the forward pass alone, the loop
#    overlapped (commits in a writer thread) and serial, their stores compared byte for byte
part extract_grid "${PART_GRID:-150}" python3 benchmarks/extraction.py --device cuda --images 1000 \
  --autocast bfloat16 --batch 16 --workers 14 --write-ahead 2 --against-cpu 2
part extract_regions "${PART_REGIONS:-90}" python3 benchmarks/extraction.py --detector vg \
  --device cuda --images 8 --batch 2 --workers 4 --against-cpu 1
#    the same loop with the JPEGs decoded on the GPU (extract-grid --decode device: nvJPEG,
#    batched), 4 workers reading bytes only: decoding off the loop's critical path
part extract_grid_device_decode "${PART_GRID_DECODE:-150}" python3 benchmarks/extraction.py \
  --device cuda --images 1000 --autocast bfloat16 --batch 16 --workers 4 --write-ahead 2 \
  --decode device --against-cpu 2
echo "== targets: the extract-grid loop at >= 80 % of its forward pass alone (extract_grid,"
echo "   extract_grid_device_decode: 'busy'); extract-regions with the VG detector at 600x1000"
echo "   at >= 6.5 images/s (extract_regions; MILVLG's bottom-up-attention.pytorch states 6.48)"
# the bottom-up rule's region selection: every class at once against the per-class loop,
# 300 proposals x 1,600 classes (docs/benchmarks.md, "Region selection")
part region_selection "${PART_SELECTION:-60}" python3 benchmarks/region_selection.py --device cuda
# 6. a rehearsal of configs/coco.yaml at real sizes: the BUTD block (the VG detector at 600x1000,
#    one XE and one SCST epoch of top_down, evaluations, the report) through `capstack run` on
#    made-up COCO-size images, each stage timed and projected beside real_data_needs.py's figures
part rehearsal "${PART_REHEARSAL:-900}" python3 benchmarks/rehearsal.py --device cuda \
  --images "${REHEARSAL_IMAGES:-1000}"
# the whole suite with the GPU visible, in what time is left: each failure named. Its CLI tests
# run the installed entry point beside the interpreter: where capstack is not installed (a
# machine with no registry), a two-line one that runs this checkout's cli.py takes its place.
entry=$(python3 -c 'import sys, pathlib; print(pathlib.Path(sys.executable).with_name("capstack"))')
if [ "${PART_SUITE:-150}" != 0 ] && [ ! -e "$entry" ]; then
  printf '#!/bin/sh\nPYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}" exec "%s" -c %s "$@"\n' "$PWD" \
    "$(python3 -c 'import sys; print(sys.executable)')" \
    "'import sys; sys.argv[0] = \"capstack\"; from cli import main; main()'" >"$entry" \
    && chmod +x "$entry" && echo "== $entry: written (capstack was not installed)"
fi
part test_suite "${PART_SUITE:-150}" python3 -m pytest -p no:cacheprovider -n 14 --dist loadfile \
  --timeout 120 -W ignore -rf -v ${SUITE_TESTS:-}  # SUITE_TESTS: some test files only
echo "== failures in the suite:"
grep -E "(FAILED|ERROR) tests/" "$LOGS/test_suite.log" | sort -u | head -40
