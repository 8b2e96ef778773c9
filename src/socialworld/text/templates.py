"""Every text template of the project, in one place, named and versioned.

* ``NPC_REPLIES`` (``npc-replies-v1``): what NPCs say, realised with a per-NPC style opener.
* ``CUES`` (``cues-v1``): mood cues the agent sees instead of moods.
* ``AGENT_UTTERANCES`` (``agent-utterances-v1``): what the scripted policies say.
* ``OBSERVATION_TEXT`` (``observation-text-v1``): the rendered observation.
* ``NPC_VOICE_*`` (``npc-voice-v1``): the prompt of a model that voices NPC lines (``socialworld.world.voice``).

Templates are plain ``str.format`` strings; the engine decides *which* one, never the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

NPC_REPLIES_VERSION = "npc-replies-v1"
CUES_VERSION = "cues-v1"
AGENT_UTTERANCES_VERSION = "agent-utterances-v1"
OBSERVATION_TEXT_VERSION = "observation-text-v1"

STYLE_OPENERS: dict[str, str] = {
    "warm": "Oh, ",
    "formal": "Well, ",
    "blunt": "",
    "shy": "Um... ",
    "cheerful": "Ha, ",
}

NPC_REPLIES: dict[str, str] = {
    "approach": "{open}nice of you to check in.",
    "approach_again": "{open}yes, still here.",
    "inquire_truth": "{open}for the {slot}, I'd really like {fav}.{vetoes}",
    "inquire_vetoes": " I can't do {vetoes}.",
    "inquire_vague": "{open}hard to say, I'm not sure about the {slot} yet.",
    "inquire_repeat": "{open}I already told you about the {slot}.",
    "confide": "{open}between us: {secret}",
    "accept": "{open}{option} works for me.",
    "reject_veto": "{open}{option} is out of the question for me.",
    "reject_dislike": "{open}I'm not keen on {option}.",
    "reject_dislike_fav": "{open}I'm not keen on {option}; I'd rather have {fav}.",
    "reject_conflict": "{open}not until things with {other} are sorted out.",
    "negotiate_accept": "{open}alright, with that, {option} works for me.",
    "negotiate_reject": "{open}that's kind, but I'm still not keen on {option}.",
    "negotiate_noted": "{open}noted.",
    "promise_terms": " Deal, as long as I get {target} for the {target_slot}.",
    "repair_ok": "{open}thanks, I appreciate that.",
    "repair_wasted": "{open}there's nothing to apologise for.",
    "repair_wrong_order": "{open}so you're taking {other}'s side before hearing me out?",
    "finalize_ok": "{open}great, {option} it is.",
    "finalize_refuse": "{open}wait, I never agreed to {option}.",
    "broken_promise": "{open}you promised me {target} for the {target_slot}!",
}

CUES: dict[str, tuple[str, str, str]] = {
    # style: (low, mid, high)
    "warm": ("sounds hurt", "seems fine", "sounds delighted"),
    "formal": ("is curt", "is composed", "is openly pleased"),
    "blunt": ("sounds annoyed", "shrugs", "sounds upbeat"),
    "shy": ("goes quiet", "nods along", "smiles"),
    "cheerful": ("stopped joking", "is chatty", "is beaming"),
}

ANNOUNCEMENTS: dict[str, str] = {
    "participant_leaves": "{name} has to leave and will not take part in the open decisions.",
    "late_arrival": "{name} has just arrived and joins the open decisions.",
    "preference_change": "{name} seems to be having second thoughts about the {slot}.",
}

AGENT_UTTERANCES: dict[str, str] = {
    # expert-v1: polite, addressed, names the option, grounded where possible
    "approach": "Hi {name}, how are you doing? I'd love to hear your thoughts.",
    "inquire": "{name}, what would you prefer for the {slot}? Thanks for sharing.",
    "propose": "How about {option} for the {slot}, {who}? Would that work for you?",
    "propose_grounded": "{who}, I know you mentioned {ground}; how about {option} for the {slot}? Would that work?",
    "negotiate": "{name}, could we go with {option} for the {slot} if {offer}? I'd appreciate it.",
    "repair": "{name}, I'm sorry about earlier, and thank you for your patience.",
    "finalize": "Thanks everyone, let's lock in {option} for the {slot}.",
    "wait": "Let's give it a moment, thanks everyone.",
    "end": "Thank you all, that's everything for today.",
}

RANDOM_UTTERANCES: tuple[str, ...] = (
    "ok",
    "Whatever, we just have to decide now.",
    "{name}, you must accept {option} immediately.",
    "Hello?",
    "I think {option} is fine, maybe, I don't know, let's see what happens with everything and everyone.",
    "{name}, please, what about the {slot}?",
    "Fine, {option}. No choice.",
    "Did you hear that {secret_hint}?",
)

OBSERVATION_TEXT = """\
{name} ({tier}), turn {step}/{budget}, {left} turns left.
Role: {role}
Goal: {goal}
{budget_line}People:
{people}
Decisions:
{slots}
{facts}{commitments}{conflicts}{announcements}{recent}Offers: {offers}
Actions: approach(npc) inquire(npc, slot) propose(slot, option, npc|all) negotiate(npc, slot, option, offer) \
repair(npc) wait() finalize(slot, option) end()"""

# ---------------------------------------------------------------- language-model policy prompts

POLICY_PROMPT_VERSION = "policy-v13"

# policy-v2: the scenario's static brief moved into the system message (cacheable per
# scenario); the user message holds only the state at this step. (policy-v1 had both in the
# user message; retired before any adapter was trained on it.)
# policy-v3: the user message also lists the agent's own last actions (``Observation.moves``).
# Under policy-v2 consecutive prompts differed by little more than the turn number, and a
# behaviour-cloned bundled model repeated one action for whole episodes (docs/design.md).
# policy-v4: each open decision's line says what each of its stakeholders is known to want
# (``wants: dev=hiking mia=? omar=vague2``, from the public fact log) instead of a flat
# "Known:" list of the last eight preferences; vetoes and dislikes stay in "Known:". Under
# policy-v3 a behaviour-cloned model kept asking the same person: whom it had not asked yet
# was spread over the whole prompt.
# policy-v5: a decision whose proposal every present stakeholder accepted says so ("everyone here
# agrees": the moment to finalize, which a cloned model otherwise had to infer by comparing two
# lists), and the system message states the reply format in one template line instead of a
# worked example (fewer tokens in every prompt and training row; constrained decoding enforces
# the format anyway). Under policy-v4 a cloned model kept re-proposing an accepted
# option across a second tier's scenarios.
# policy-v6: "You did:" lists every earlier move of the episode once, in the order first made, with
# how often it was made ("inquire(raj, gift) x3") and the latest named apart ("last: ..."), and
# an open decision's line names the option the known wants favour ("favoured: spa_voucher": two
# for each present stakeholder known to prefer it, minus one for each known to dislike it, none
# vetoed, within the budget; shown once someone's wish is known). Under policy-v5 the prompt
# showed the last three moves only, so a three-move cycle (inquire, inquire, approach) left the
# prompt unchanged but for the turn number, and the cloned policy ran such cycles to the end of its
# budget, most of them asking someone whose wish the line already showed, where the expert proposed it.
# policy-v8: the same facts in words that are the same in every scenario and in fewer tokens
# (``agents.lm.prompts.state``): each person's mood bucket, not the style's cue phrase; each open
# decision with its proposal and answers, its stakeholders' known wants and the options it can still
# win best first (what the known vetoes, dislikes, promises and budget leave); no "Known:" list (the
# ranking holds it) and no last line of talk; the brief's options with their costs where there is a
# budget, and its offers in the order to try them with what each binds or costs: fewer tokens, and a
# student fits more of the states it has not seen, of its scenarios and of scenarios it never saw.
# policy-v9: policy-v8, and a standing proposal that is still the decision's best option says so
# (``proposed cooking_kit (still best)``: win over who said no, do not propose it again), and each person
# who turned it down carries what the agent already tried with them on it: ``no priya (tried
# lead_discussion)``, the offers made for that option
# and ``one-to-one`` for a proposal repeated to them alone (``agents.lm.prompts.state``). Under policy-v8
# the student re-proposed a turned-down option it ranked best, or cycled through offers, for the rest of
# the episode: its commonest step apart from the expert's was a proposal where the expert negotiated with
# whoever said no. What was
# tried stood only in "You did:", far from the decision it concerns.
# policy-v10: policy-v9, and a standing proposal's line names who present has not answered it (``unanswered
# nora``: a quarrel or second thoughts wipe an answer, a late arrival has none), and each quarrel names whom
# to repair next (``Quarrel: nora vs sam, repair nora next``: the more hurt by mood cue, the other one once a
# repair did not count; ``agents.beliefs.repair_next``, the expert's rule). Under policy-v9 the student's
# steps at L2 that differed from the expert's were most often a repair of the wrong side of a quarrel or of
# the same side again, and a negotiation with whoever
# said no where the expert first put the proposal to a stakeholder who had not answered.
# policy-v11: policy-v10, and what people said back to the agent's last move (``Heard: aisha: Oh, I already
# told you about the fundraiser.``): the world's own words for a move that changed nothing (a repeated
# question, an offer already made, an approach to someone already engaged) and for a finalize that failed.
# Under policy-v10 a futile move left the state as it was but for the tally, and the student repeated it
# (the same question to the same person, turn after turn); and the policy never read what people said, so
# an NPC voice (``--npc-voice``) could not reach it. The people's words vary between states that need the
# same move, and the student fitted its rows less well.
# policy-v13: policy-v10, and a proposal the group has mostly taken (three or more of the present stakeholders,
# and more than half, said yes, and no known veto: ``agents.beliefs.carried``) is its decision's best option,
# so its line says ``(still best)`` while whoever said no is won over. Made with expert-v5, which keeps such a
# proposal where expert-v4 asked whoever said no what they wanted and turned to their favourite: under
# policy-v10 the best list put that favourite first (``proposed classic, yes priya grace leo, no tom; ... best
# thriller memoir scifi``) where the expert now negotiates with tom. (policy-v12 named a prompt tried and left.)
_POLICY_SYSTEM_V2 = (
    "You organise a group decision: ask people what they want, propose options they accept, "
    "negotiate with those who refuse, finalize once all agree.\n"
    "Reply in three lines: what the person who spoke last wants and how they feel, your action, "
    "your words. For example:\n"
    "BELIEF: ann venue=park mood=high\n"
    "ACTION: propose(venue, park, all)\n"
    "SAY: Ann and Bob, how about the park? Would that work for you?\n\n"
    "{brief}"
)
_POLICY_SYSTEM_V5 = (
    "You organise a group decision: ask people what they want, propose options they accept, negotiate with "
    "those who refuse, finalize once all agree. Reply in three lines:\n"
    "BELIEF: <person> <decision>=<option> mood=<low|mid|high>\nACTION: <action>\nSAY: <your words>\n\n"
    "{brief}"
)
@dataclass(frozen=True)
class PolicyStateView:
    """What a prompt version's state (``agents.lm.prompts.compact``) shows beyond the basics."""

    wants: bool = False
    """each open decision says what its stakeholders are known to want (policy-v4)"""
    agreed: bool = False
    """a proposal every present stakeholder accepted says so (policy-v5)"""
    favoured: bool = False
    """each open decision names the option the known wants favour (policy-v6)"""
    tally: bool = False
    """"You did:" tallies every earlier move with the latest apart (policy-v6), not the last ``POLICY_LAST_MOVES``"""
    terms: bool = False
    """policy-v8: the state in words that are the same in every scenario (``agents.lm.prompts.state``: mood
    buckets, each decision's options best first), and the brief's options with their costs and offers in
    the order to try them"""
    tried: bool = False
    """policy-v9: a standing proposal still ranked best says so, and each person who turned it down carries
    what was tried with them on it"""
    pending: bool = False
    """policy-v10: a standing proposal names who present has not answered it, and each quarrel whom to
    repair next"""
    heard: bool = False
    """policy-v11: what people (and the world) said back to the agent's last move, shown before its moves"""
    carried: bool = False
    """policy-v13: a proposal the group has mostly taken is its decision's best option (``still best``)"""


@dataclass(frozen=True)
class PolicyPrompt:
    """One version of the language-model policy's prompt, whole."""

    version: str
    system: str
    """the system message; ``{brief}``: the scenario's static part (``agents.lm.prompts.brief``)"""
    user: str
    """the user message; ``{obs}``: the state (``agents.lm.prompts.compact``), ``{moves}``: the
    agent's own earlier moves (or ``POLICY_NO_MOVES``)"""
    view: PolicyStateView
    """what the state shows beyond the basics"""


_MOVES = "{obs}\nYou did: {moves}"
POLICY_PROMPTS: dict[str, PolicyPrompt] = {p.version: p for p in (
    PolicyPrompt("policy-v2", _POLICY_SYSTEM_V2, "{obs}", PolicyStateView()),
    PolicyPrompt("policy-v3", _POLICY_SYSTEM_V2, _MOVES, PolicyStateView()),
    PolicyPrompt("policy-v4", _POLICY_SYSTEM_V2, _MOVES, PolicyStateView(wants=True)),
    PolicyPrompt("policy-v5", _POLICY_SYSTEM_V5, _MOVES, PolicyStateView(wants=True, agreed=True)),
    PolicyPrompt("policy-v6", _POLICY_SYSTEM_V5, _MOVES, PolicyStateView(wants=True, agreed=True, favoured=True, tally=True)),
    PolicyPrompt("policy-v8", _POLICY_SYSTEM_V5, _MOVES, PolicyStateView(wants=True, agreed=True, favoured=True, tally=True, terms=True)),
    PolicyPrompt("policy-v9", _POLICY_SYSTEM_V5, _MOVES,
                 PolicyStateView(wants=True, agreed=True, favoured=True, tally=True, terms=True, tried=True)),
    PolicyPrompt("policy-v10", _POLICY_SYSTEM_V5, _MOVES,
                 PolicyStateView(wants=True, agreed=True, favoured=True, tally=True, terms=True, tried=True, pending=True)),
    PolicyPrompt("policy-v11", _POLICY_SYSTEM_V5, _MOVES, PolicyStateView(
        wants=True, agreed=True, favoured=True, tally=True, terms=True, tried=True, pending=True, heard=True)),
    PolicyPrompt("policy-v13", _POLICY_SYSTEM_V5, _MOVES, PolicyStateView(
        wants=True, agreed=True, favoured=True, tally=True, terms=True, tried=True, pending=True, carried=True)),
)}
"""every prompt version by its name (records name the version they were made under)"""
POLICY_LAST_MOVES = 3
"""how many of the agent's latest moves "You did:" lists under a version without ``tally``"""
POLICY_ALL_AGREE = "everyone here agrees"
POLICY_STILL_BEST = "still best"
"""policy-v9: after a standing proposal that is still the first of its decision's ``best`` options"""
POLICY_UNANSWERED = "unanswered"
"""policy-v10: before who present has not answered a standing proposal"""
POLICY_REPAIR_NEXT = "repair {npc} next"
"""policy-v10: after an open quarrel, whom to repair next"""
POLICY_NO_MOVES = "nothing yet"
POLICY_HEARD = "Heard: "
"""policy-v11: before the replies to the agent's last move (``speaker: line``, one after another)"""
POLICY_FAVOURED = "favoured"

# ---------------------------------------------------------------- the world as tools (TRL's environment_factory)

TOOL_PROMPT_VERSION: Final = "tools-v1"
TOOL_TASK = (
    "You organise a group decision: ask people what they want, propose options they accept, negotiate with "
    "those who refuse, finalize once all agree. Act by calling one tool a turn; each tells you what people "
    "said and the new state.\n\n{brief}\n\n{state}"
)
"""what ``reset`` returns: ``{brief}`` the scenario's static part, ``{state}`` the first state (policy prompt's user message)"""
TOOL_RESULT = "{said}{state}"
"""a tool's answer: ``{said}`` the people's replies (one line each, or nothing), then the new state"""
TOOL_REFUSED = "The world did not take that move ({error}): you waited this turn.\n"
"""the line before the state when a move was not legal or did not parse (the world's wait() and penalty)"""
TOOL_OVER = "The meeting is over: {result} ({done} of {total} decisions settled)."
"""a tool's answer when its move ended the episode; ``{result}``: passed or not passed"""
TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}"
    "({{ t.function.parameters.properties.keys() | join(', ') }}){% endfor %}<|im_end|>\n{% endif -%}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}<tool_call>\n{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""a ChatML chat template for small models playing ``ToolEnv``: one system line names each tool with its
arguments (``propose(decision, option, to, say)``) instead of rendering their JSON schemas (team lunch's
first prompt in 478 tokens of the tiny test model's tokenizer, against 2,347 under TRL's Qwen2.5
template), and calls are written as Qwen's ``<tool_call>`` JSON, which TRL's ``qwen3_template``
response parser reads (``rollout.toolenv.compact_tool_chat``)"""

# ---------------------------------------------------------------- theory-of-mind stories

TOM_STORY_VERSION: Final = "tom-story-v1"

TOM_SENTENCES: dict[str, str] = {
    "enter": "{agent} enters the {room}.",
    "leave": "{agent} leaves the {room}.",
    "place": "{agent} puts the {obj} in the {dest}.",
    "move": "{agent} moves the {obj} to the {dest}.",
}

TOM_QUESTIONS: dict[str, str] = {
    "reality": "Where is the {obj} really?",
    "first_order": "Where will {a} look for the {obj}?",
    "second_order": "Where does {a} think {b} will look for the {obj}?",
}

# world episodes as stories (the second source): who was there when each proposal was made
WORLD_STORY_VERSION: Final = "world-story-v1"
WORLD_SENTENCES: dict[str, str] = {
    "propose": "{agent} proposes the {dest} for the {obj}.",
}
WORLD_QUESTIONS: dict[str, str] = {
    "reality": "Which {obj} was proposed last?",
    "first_order": "Which {obj} does {a} think was proposed last?",
    "second_order": "Which {obj} does {a} think {b} heard proposed last?",
}
WORLD_NOTHING = "nothing"
WORLD_ORGANISER = "Organiser"

TOM_PROMPT_VERSION = "tom-v1"

TOM_QA_SYSTEM = ("Read the story and answer the question with one place from the story. "
                 "People only know about moves they saw while they were in the room.")
WORLD_QA_SYSTEM = ("Read the story and answer the question with one option from the story, or nothing. "
                   "People only hear proposals made while they are in the room.")
TOM_QA_USER = "Story:\n{story}\n{s3ap}Question: {question}\nAnswer with one of: {options}."
TOM_QA_S3AP = "Structured state (S3AP: who observed what at each timestep):\n{s3ap}\n"

TOM_PARSE_SYSTEM = (
    "Turn the story into S3AP JSON: {\"version\": \"s3ap-v1\", \"scenario_id\": \"tom\", \"seed\": 0, "
    "\"agents\": [names], \"timesteps\": [one per sentence: {\"timestep\": i, \"state\": the sentence, "
    "\"observations\": {name: \"<same_as_state />\" for the actor, \"<same_as_last_action_ACTOR />\" for the others "
    "in the room, \"none\" for those outside}, \"actions\": {actor: the sentence}}]}. Reply with the JSON only.")
TOM_PARSE_RETRY = "That is not valid S3AP: {errors}\nReply with corrected JSON only."

# ---------------------------------------------------------------- Foresee-and-Act world model

FORESEE_PROMPT_VERSION = "foresee-v1"

FORESEE_SYSTEM = (
    "You predict how people react in a group decision. Given the state and the organiser's next "
    "action, write one line per person present: their mood afterwards (low, mid, high) and their "
    "stance afterwards on the decision the action is about (accepts, rejects, undecided; leaves if "
    "they walk out). For example:\n"
    "ann: mood=high stance=accepts\n"
    "bob: mood=low stance=rejects\n\n"
    "{brief}"
)
FORESEE_USER = "{obs}\nThe organiser now does: {action}\nPredict each person's reaction."

# ---------------------------------------------------------------- episode-chain memory

MEMORY_TEXT_VERSION = "memory-v1"
MEMORY_HEADER = "From earlier meetings with the same people ({mode} memory):"
MEMORY_FULL_EPISODE = "Meeting {n}:"
MEMORY_SUMMARY_EPISODE = "Meeting {n}: {outcome}. Worked: {worked}."
MEMORY_SUMMARY_NPC = "  {npc}: {known}{ending}"

# ---------------------------------------------------------------- the optional LM judge (contract §3.5)

JUDGE_PROMPT_VERSION = "judge-v1"
JUDGE_DIMENSIONS: dict[str, str] = {
    # SOTOPIA's goal completion and believability (Lifelong-SOTOPIA's GOAL and BEL), 0-10
    "goal": "GOAL",
    "believability": "BELIEVABILITY",
}
JUDGE_SYSTEM = (
    "You rate an organiser who helps a group of people reach decisions together. Read the setting and "
    "the conversation, then score the organiser from 0 to 10 on two dimensions:\n"
    "GOAL: how fully the organiser reached its goal (decisions everyone accepts, people kept happy); "
    "0 = nothing achieved, 10 = everything.\n"
    "BELIEVABILITY: how natural, consistent and human-like the organiser's words and moves are; "
    "0 = erratic or robotic, 10 = like a thoughtful person.\n"
    "Reply with exactly two lines:\nGOAL: <0-10>\nBELIEVABILITY: <0-10>"
)
JUDGE_USER = (
    "Setting: {setting}\nThe organiser's goal: {goal}\nPeople: {people}\nDecisions: {decisions}\n\n"
    "Conversation:\n{transcript}\n\nScore the organiser."
)
JUDGE_TURN = "[{step}] organiser ({action}): {words}"
JUDGE_REPLY = "[{step}] {speaker}: {text}"

# ---------------------------------------------------------------- NPC voices (socialworld.world.voice)

NPC_VOICE_VERSION = "npc-voice-v1"
NPC_VOICE_MOODS: dict[str, str] = {"low": "upset", "mid": "calm", "high": "happy"}
"""the visible mood bucket as the voice's prompt says it (no bucket yet: ``calm``)"""
NPC_VOICE_SYSTEM = (
    "You are {name}, {profile}. Say the line you are given in your own words, as {name} would say it "
    "aloud, feeling {mood}: one or two short sentences with the same meaning. Name no person, option or "
    "fact that the line does not name. Reply with the new line only."
)
NPC_VOICE_USER = "{template}"
