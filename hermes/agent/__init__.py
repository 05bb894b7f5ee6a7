"""One prompt's agent: the loop, its conversation in a sandbox, a single run outside batches.

    loop.py          the agent loop: model call, tool calls, until an answer or max_turns (AgentRun)
    conversation.py  one agent run in a prompt's sandbox: its tools, the row's setup and check
    offload.py       the conversation's pool of threads for blocking tool work
    prefill.py       few-shot messages put before the prompt (--prefill_messages_file)
    single_run.py    `hermes-batch chat`: one run, optionally saved as a trajectory sample

Below it: model/, data/, tools/, sandbox/. Nothing here knows about runs or batches.
"""
from hermes.lazyimport import lazy_surface

__getattr__, __all__ = lazy_surface(__name__, {
    "AgentRun": "loop",
    "AgentEvents": "loop",
    "DEFAULT_SYSTEM_PROMPT": "loop",
    "compose_system_prompt": "loop",
    "run_agent": "loop",
    "run_agent_async": "loop",
    "Conversation": "conversation",
    "converse": "conversation",
    "converse_async": "conversation",
    "tool_context": "conversation",
    "Offload": "offload",
    "load_prefill": "prefill",
})
