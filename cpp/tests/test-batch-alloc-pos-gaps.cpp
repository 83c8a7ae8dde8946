// The series' test of opt-in position gaps (llama_set_allow_pos_gaps, patch 0002), with the helpers of upstream's
// test-batch-alloc.cpp: the file is included whole, its main renamed, so the test stays out of the patch.

#define main test_batch_alloc_main
#include "test-batch-alloc.cpp"
#undef main

// opt-in position gaps for models without M-RoPE (llama_set_allow_pos_gaps, used by sparse prefill)
static void test_pos_gaps(testing & t) {
    llama_vocab vocab;

    auto make_batch = [](batch_builder & bb, std::initializer_list<llama_pos> positions) {
        for (llama_pos p : positions) {
            bb.add(p, {0}, false);
        }
    };

    t.test("gaps_in_batch", [&](testing & t) {
        llama_batch_allocr ba(1);
        {
            batch_builder bb;
            make_batch(bb, {0, 1, 5, 9});
            t.assert_true("rejected by default", !ba.init(bb.b, vocab, false));
        }
        ba.set_allow_pos_gaps(true);
        {
            batch_builder bb;
            make_batch(bb, {0, 1, 5, 9});
            t.assert_true("accepted when allowed", ba.init(bb.b, vocab, false));
            t.assert_equal(0, ba.seq_pos_min(0));
            t.assert_equal(9, ba.seq_pos_max(0));
        }
        {
            batch_builder bb;
            make_batch(bb, {4, 2});
            t.assert_true("decreasing positions are still rejected", !ba.init(bb.b, vocab, false));
        }
        {
            batch_builder bb;
            make_batch(bb, {0, 1, 1, 5});
            t.assert_true("a position twice is rejected", !ba.init(bb.b, vocab, false));
        }
        ba.set_allow_pos_gaps(false);
        {
            batch_builder bb;
            make_batch(bb, {0, 1, 5, 9});
            t.assert_true("rejected again once disallowed", !ba.init(bb.b, vocab, false));
        }
    });

    t.test("gaps_after_memory", [&](testing & t) {
        mock_memory mem;
        mem.ranges[0] = {0, 9};

        llama_batch_allocr ba(1);
        ba.set_allow_pos_gaps(true);
        {
            batch_builder bb(2, &mem);
            make_batch(bb, {15, 16});
            t.assert_true("jump forward after memory is accepted", ba.init(bb.b, vocab, false));
        }
        {
            batch_builder bb(2, &mem);
            make_batch(bb, {10, 11});
            t.assert_true("pos_max + 1 is still accepted", ba.init(bb.b, vocab, false));
        }
        {
            batch_builder bb(2, &mem);
            make_batch(bb, {8, 12});
            t.assert_true("starting behind memory is rejected", !ba.init(bb.b, vocab, false));
        }
    });
}

int main(int argc, char ** argv) {
    testing t;
    const char * verbose = getenv("LLAMA_TEST_VERBOSE");
    t.verbose = verbose && std::string(verbose) == "1";
    if (!t.verbose) {
        llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    }
    if (argc > 1) {
        t.set_filter(argv[1]);
    }
    t.test("pos_gaps", test_pos_gaps);
    return t.summary();
}
