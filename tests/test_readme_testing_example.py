"""The example of the README's "Testing your project" section (a test pins that the two are the same)."""

import pytest

from streamrecover.testing.host import assert_recovered, wait_for

pytestmark = pytest.mark.django_db(transaction=True)  # runs execute in another thread


def test_a_stream_cut_mid_answer_is_continued(streamrecover_fake):
    report = streamrecover_fake.run("Tell me about rivers [[words=150]]", faults=["cut:bytes=1500"])

    assert_recovered(report, interruptions=1, cause="connection_reset", plan="continue_text")
    assert report.view.text() == report.assistant_text  # what the browser showed was committed
    assert len(streamrecover_fake.requests) == 2  # the answer, then one continuation


@pytest.mark.streamrecover_faults("error:events=20,type=overloaded_error")
def test_my_api_recovers_through_my_own_view(streamrecover_fake, admin_client):
    created = admin_client.post(
        "/streamrecover/api/runs/", {"prompt": "Hello [[words=80]]"}, content_type="application/json"
    )
    report = wait_for(created.json()["run_id"])

    assert_recovered(report, cause="provider_error_mid_stream")
    assert report.event_names().count("llm_stream_continuation_completed") == 1
