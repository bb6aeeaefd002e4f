"""Numbers and ranks in a sentence (course_lib/words.py): the one way every message writes
them."""

from course_lib.words import listing, nth, ranks


def test_a_listing_reads_as_a_sentence():
    assert [listing(x) for x in ([], [2], [2, 3], [2, 3, 4], range(4))] == [
        "", "2", "2 and 3", "2, 3 and 4", "0, 1, 2 and 3"]


def test_ranks_are_named_once_each_in_order():
    assert [ranks(x) for x in ([1], [2, 0], [3, 0, 2, 2])] == [
        "rank 1", "ranks 0 and 2", "ranks 0, 2 and 3"]


def test_nth():
    assert [nth(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st",
        "111th"]
