from streamrecover.engine.blocks import Accumulator
from streamrecover.engine.events import BlockStart, BlockStop, TextDelta


def test_accumulator_builds_text_block():
    acc = Accumulator()
    acc.apply(BlockStart(0, "text"))
    acc.apply(TextDelta(0, "Hel"))
    acc.apply(TextDelta(0, "lo"))
    assert acc.snapshot().blocks[0].status().value == "partial"
    acc.apply(BlockStop(0))
    assert acc.snapshot().blocks[0].to_content() == {"type": "text", "text": "Hello"}
