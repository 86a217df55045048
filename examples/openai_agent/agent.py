"""An agent program written against the OpenAI API, trained by mgrpo's `openai_agents` workflow.

A planner breaks the question into a lookup, a searcher answers the lookup (it may call a `search`
tool, run here in the program), a comparer checks the finding against the question, and the planner
gives the final answer. Every role is a separate model behind its own base URL; mgrpo trains all
three on each run's outcome. Any OpenAI-API program works the same way: take `base_urls` and
`api_key`, make chat completions, return the final answer.

    job: {"workflow": "openai_agents", "program": {"entry_point": "examples.openai_agent.agent:run"}, …}
"""

from __future__ import annotations

from openai import OpenAI

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the notes; returns matching lines.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
NOTES = ["Kir Naibram was born in Lotham in 1971.", "Lotham is a city in Vouzuia."]


def search(query: str) -> str:
    words = {w.lower() for w in query.split()}
    return "\n".join(n for n in NOTES if words & {w.lower().strip(".") for w in n.split()}) or "no results"


def say(client: OpenAI, role: str, messages: list, **kw: object) -> object:
    return (
        client.chat.completions.create(model=role, messages=messages, max_tokens=48, **kw).choices[0].message
    )


def run(query: str, base_urls: dict[str, str], api_key: str) -> str:
    planner, searcher, comparer = (
        OpenAI(base_url=base_urls[r], api_key=api_key or "none", max_retries=1, timeout=120)
        for r in ("planner", "searcher", "comparer")
    )
    history = [
        {"role": "system", "content": "Write the one lookup that answers the question."},
        {"role": "user", "content": query},
    ]
    lookup = say(planner, "planner", history).content or query
    found_msgs = [{"role": "user", "content": lookup}]
    found = say(searcher, "searcher", found_msgs, tools=[SEARCH_TOOL])
    for call in (found.tool_calls or [])[:2]:  # run its tool calls, then let it answer
        found_msgs += [
            found.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": search(call.function.arguments)},
        ]
        found = say(searcher, "searcher", found_msgs, tools=[SEARCH_TOOL])
    check = say(
        comparer,
        "comparer",
        [{"role": "user", "content": f"Question: {query}\nFinding: {found.content}\nDoes it answer it?"}],
    )
    history += [
        {"role": "assistant", "content": lookup},
        {
            "role": "user",
            "content": f"Finding: {found.content}\nCheck: {check.content}\nThe final answer, in a few words:",
        },
    ]
    return say(planner, "planner", history).content or ""
