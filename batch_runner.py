"""Drop-in for hermes-agent's batch_runner.py: same flags, same output, on hermes-batch.

    python batch_runner.py --dataset_file=data/prompts.jsonl --batch_size=10 --run_name=my_run
"""
import sys

from flows.run_command import run_from_args, run_parser

if __name__ == "__main__":
    sys.exit(run_from_args(run_parser("batch_runner.py").parse_args()))
