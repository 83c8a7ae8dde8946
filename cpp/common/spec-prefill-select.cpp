#include "spec-prefill-select.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

//
// thread pool
//

struct common_spec_prefill_pool {
    std::vector<std::thread> workers;

    std::mutex mutex;
    std::condition_variable cv_start;
    std::condition_variable cv_done;
    uint64_t generation = 0; // a new run
    int32_t  n_busy     = 0; // workers still in the current run
    bool     stop       = false;

    const std::function<void(int32_t)> * f = nullptr;
    int32_t n = 0;
    std::atomic<int32_t> next { 0 };

    // take indices until none are left
    void work() {
        for (int32_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
            (*f)(i);
        }
    }
};

common_spec_prefill_pool * common_spec_prefill_pool_init(int32_t n_threads) {
    auto * pool = new common_spec_prefill_pool;
    for (int32_t t = 1; t < std::max(1, n_threads); ++t) {
        pool->workers.emplace_back([pool]() {
            uint64_t seen = 0;
            while (true) {
                {
                    std::unique_lock<std::mutex> lock(pool->mutex);
                    pool->cv_start.wait(lock, [&] { return pool->stop || pool->generation != seen; });
                    if (pool->stop) {
                        return;
                    }
                    seen = pool->generation;
                }
                pool->work();
                {
                    std::unique_lock<std::mutex> lock(pool->mutex);
                    pool->n_busy--;
                }
                pool->cv_done.notify_one();
            }
        });
    }
    return pool;
}

void common_spec_prefill_pool_free(common_spec_prefill_pool * pool) {
    if (!pool) {
        return;
    }
    {
        std::unique_lock<std::mutex> lock(pool->mutex);
        pool->stop = true;
    }
    pool->cv_start.notify_all();
    for (auto & w : pool->workers) {
        w.join();
    }
    delete pool;
}

void common_spec_prefill_pool_run(common_spec_prefill_pool * pool, int32_t n, const std::function<void(int32_t)> & f) {
    if (n <= 1 || pool->workers.empty()) {
        for (int32_t i = 0; i < n; ++i) {
            f(i);
        }
        return;
    }
    {
        std::unique_lock<std::mutex> lock(pool->mutex);
        pool->f = &f;
        pool->n = n;
        pool->next = 0;
        pool->n_busy = (int32_t) pool->workers.size();
        pool->generation++;
    }
    pool->cv_start.notify_all();
    pool->work();
    std::unique_lock<std::mutex> lock(pool->mutex);
    pool->cv_done.wait(lock, [&] { return pool->n_busy == 0; });
    pool->f = nullptr;
}

//
// scoring
//

struct common_spec_prefill_scores {
    int64_t n_keys;
    int32_t pool_kernel;
    int32_t n_threads;

    int32_t n_rows = 0;

    // the current row's max over (layer, head), one buffer per thread (heads are split across threads), merged at
    // the end of the row
    std::vector<std::vector<float>> row_max;
    std::vector<double> sum; // [n_keys] sum of finished rows' maxima
};

// work (heads x keys) below this is not worth a thread
static constexpr int64_t SCORES_WORK_PER_THREAD = 1 << 17;

// pooled[j] for j in [0, n) of a span: mean of p[i] over i in [j - left, j + right] clipped to the span, folded
// into out[j] as max(out[j], pooled[j] * scale)
static void pool_max(const float * p, int64_t n, int32_t kernel, double scale, float * out) {
    if (kernel <= 1) {
        for (int64_t j = 0; j < n; ++j) {
            out[j] = std::max(out[j], (float) (p[j] * scale));
        }
        return;
    }
    const int64_t left  = (kernel - 1) / 2;
    const int64_t right = kernel / 2;

    int64_t lo = 0;
    int64_t hi = std::min<int64_t>(n - 1, right); // inclusive
    double acc = 0.0;
    for (int64_t i = lo; i <= hi; ++i) {
        acc += p[i];
    }
    for (int64_t j = 0; j < n; ++j) {
        const double pooled = acc / (double) (hi - lo + 1);
        out[j] = std::max(out[j], (float) (pooled * scale));
        // slide to j + 1
        const int64_t lo_next = std::max<int64_t>(0, j + 1 - left);
        const int64_t hi_next = std::min<int64_t>(n - 1, j + 1 + right);
        if (lo_next > lo) {
            acc -= p[lo];
            lo = lo_next;
        }
        if (hi_next > hi) {
            hi = hi_next;
            acc += p[hi];
        }
    }
}

static double row_sum(const float * p, int64_t n) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        acc += p[i];
    }
    return acc;
}

common_spec_prefill_scores * common_spec_prefill_scores_init(int32_t n_keys, int32_t pool_kernel, int32_t n_threads) {
    if (n_keys <= 0) {
        return nullptr;
    }
    auto * sc = new common_spec_prefill_scores;
    sc->n_keys      = n_keys;
    sc->pool_kernel = std::max(1, pool_kernel);
    sc->n_threads   = std::max(1, n_threads);
    sc->row_max.assign(sc->n_threads, std::vector<float>(n_keys, 0.0f));
    sc->sum.assign(n_keys, 0.0);
    return sc;
}

void common_spec_prefill_scores_free(common_spec_prefill_scores * sc) {
    delete sc;
}

void common_spec_prefill_scores_begin_row(common_spec_prefill_scores * sc) {
    for (auto & buf : sc->row_max) {
        std::fill(buf.begin(), buf.end(), 0.0f);
    }
}

int32_t common_spec_prefill_scores_n_parts(const common_spec_prefill_scores * sc, int64_t n_head, int64_t n_norm) {
    const int64_t work = n_head * std::max(sc->n_keys, n_norm);
    return (int32_t) std::max<int64_t>(1, std::min<int64_t>({ sc->n_threads, n_head, work / SCORES_WORK_PER_THREAD }));
}

void common_spec_prefill_scores_add_heads_part(
        common_spec_prefill_scores * sc,
        const float * probs,
        int64_t n_head,
        int64_t row_stride,
        int64_t key0,
        int64_t n_norm,
        int32_t part,
        int32_t n_parts) {
    const int64_t step = (n_head + n_parts - 1) / n_parts;
    float * out = sc->row_max[part].data();
    for (int64_t h = part*step; h < std::min(n_head, (part + 1)*step); ++h) {
        const float * row = probs + h*row_stride;
        // renormalised over the row's prompt keys
        const double z = row_sum(row, n_norm);
        if (z > 0.0) {
            pool_max(row + key0, sc->n_keys, sc->pool_kernel, 1.0/z, out);
        }
    }
}

void common_spec_prefill_scores_add_heads(
        common_spec_prefill_scores * sc,
        const float * probs,
        int64_t n_head,
        int64_t row_stride,
        int64_t key0,
        int64_t n_norm) {
    const int32_t n_parts = common_spec_prefill_scores_n_parts(sc, n_head, n_norm);
    std::vector<std::thread> workers;
    for (int32_t t = 1; t < n_parts; ++t) {
        workers.emplace_back(common_spec_prefill_scores_add_heads_part, sc, probs, n_head, row_stride, key0, n_norm, t,
                n_parts);
    }
    common_spec_prefill_scores_add_heads_part(sc, probs, n_head, row_stride, key0, n_norm, 0, n_parts);
    for (auto & w : workers) {
        w.join();
    }
}

void common_spec_prefill_scores_add_max(common_spec_prefill_scores * sc, const float * values) {
    float * out = sc->row_max[0].data();
    for (int64_t j = 0; j < sc->n_keys; ++j) {
        out[j] = std::max(out[j], values[j]);
    }
}

void common_spec_prefill_scores_end_row(common_spec_prefill_scores * sc) {
    for (int64_t j = 0; j < sc->n_keys; ++j) {
        float m = sc->row_max[0][j];
        for (size_t t = 1; t < sc->row_max.size(); ++t) {
            m = std::max(m, sc->row_max[t][j]);
        }
        sc->sum[j] += m;
    }
    sc->n_rows++;
}

int32_t common_spec_prefill_scores_n_rows(const common_spec_prefill_scores * sc) {
    return sc->n_rows;
}

void common_spec_prefill_scores_get(const common_spec_prefill_scores * sc, float scale, float * out) {
    const double f = sc->n_rows > 0 ? (double) scale / sc->n_rows : 0.0;
    for (int64_t j = 0; j < sc->n_keys; ++j) {
        out[j] = (float) (sc->sum[j] * f);
    }
}

void common_spec_prefill_pool_row(const float * probs, int64_t key0, int64_t n_keys, int64_t n_norm,
        int32_t pool_kernel, float * out) {
    std::fill(out, out + n_keys, 0.0f);
    const double z = row_sum(probs, n_norm);
    if (z > 0.0) {
        pool_max(probs + key0, n_keys, std::max(1, pool_kernel), 1.0/z, out);
    }
}

//
// windows
//

std::vector<common_spec_prefill_window> common_spec_prefill_plan_windows(int32_t n_tokens, int32_t window) {
    std::vector<common_spec_prefill_window> windows;
    if (n_tokens <= 0) {
        return windows;
    }
    if (window <= 0 || window >= n_tokens) {
        windows.push_back({0, n_tokens});
        return windows;
    }
    // as many windows as needed, sized evenly, so that the last one is not a short remainder
    const int32_t n_windows = (n_tokens + window - 1) / window;
    const int32_t base  = n_tokens / n_windows;
    const int32_t extra = n_tokens % n_windows; // the first `extra` windows get one more token
    int32_t begin = 0;
    for (int32_t w = 0; w < n_windows; ++w) {
        const int32_t size = base + (w < extra ? 1 : 0);
        windows.push_back({begin, begin + size});
        begin += size;
    }
    return windows;
}

//
// selection
//

std::vector<int32_t> common_spec_prefill_chunks(int32_t n_tokens, int32_t chunk_size, const uint8_t * line_ends) {
    const int32_t chunk = std::max(1, chunk_size);
    std::vector<int32_t> bounds = { 0 };
    for (int32_t i0 = 0; i0 < n_tokens; ) {
        int32_t i1 = std::min(n_tokens, i0 + chunk);
        if (line_ends && chunk > 1 && i1 < n_tokens) {
            // the line end nearest to the fixed cut, from half a chunk to one and a half chunks long
            const int32_t lo = i0 + (chunk + 1)/2;
            const int32_t hi = std::min(n_tokens, i0 + chunk + chunk/2);
            int32_t best = -1;
            for (int32_t e = lo; e <= hi; ++e) {
                if (line_ends[e - 1] && (best < 0 || std::abs(e - i1) < std::abs(best - i1))) {
                    best = e;
                }
            }
            i1 = best > 0 ? best : i1;
        }
        bounds.push_back(i1);
        i0 = i1;
    }
    return bounds;
}

// the selection `chosen` with each run of kept tokens that starts or ends inside a line grown to that line's start or
// end, where at most `limit` tokens are missing, so a fact's line cut by a chunk edge keeps its first or last words
static std::vector<char> spec_prefill_complete_lines(const std::vector<char> & chosen, const uint8_t * line_ends,
        int32_t limit) {
    const int32_t n = (int32_t) chosen.size();
    std::vector<char> keep = chosen;
    for (int32_t i0 = 0; i0 < n; ) {
        if (!chosen[i0]) {
            ++i0;
            continue;
        }
        int32_t i1 = i0;
        while (i1 < n && chosen[i1]) {
            ++i1;
        }
        // [i0, i1) is a run; its line's start is the first token after a line end
        int32_t s = i0;
        while (s > 0 && !line_ends[s - 1] && i0 - s < limit) {
            --s;
        }
        if (s == 0 || line_ends[s - 1]) {
            std::fill(keep.begin() + s, keep.begin() + i0, 1);
        }
        int32_t e = i1;
        while (e < n && !line_ends[e - 1] && e - i1 < limit) {
            ++e;
        }
        if (line_ends[e - 1]) {
            std::fill(keep.begin() + i1, keep.begin() + e, 1);
        }
        i0 = i1;
    }
    return keep;
}

std::vector<uint8_t> common_spec_prefill_question_lines(const std::string * pieces, const uint8_t * line_ends,
        int32_t n_tokens, int32_t n_question, int32_t max_lines) {
    std::vector<uint8_t> out(std::max(0, n_tokens), 0);
    if (n_tokens <= 0 || max_lines <= 0 || n_question <= 0) {
        return out;
    }
    // line l is tokens [line_begin[l], line_begin[l + 1])
    std::vector<int32_t> line_begin = { 0 };
    for (int32_t i = 1; i < n_tokens; ++i) {
        if (line_ends[i - 1]) {
            line_begin.push_back(i);
        }
    }
    const int32_t n_lines = (int32_t) line_begin.size();
    line_begin.push_back(n_tokens);

    // words, and identifiers joined by '_' whole as well as by their parts: in code the parts (ggml, type, mostly)
    // are in many lines, the identifier (ggml_ftype_mostly_iq2_xxs) in the one that defines it
    auto for_each_word = [&](int32_t l, const auto & f) {
        std::string word;
        std::string ident;
        auto end_word = [&]() {
            if (word.size() >= 4) {
                f(word);
            }
            word.clear();
        };
        auto end_ident = [&]() {
            const size_t b = ident.find_first_not_of('_');
            const size_t e = ident.find_last_not_of('_');
            if (b != std::string::npos && ident.find('_', b) < e) {
                f(ident.substr(b, e - b + 1));
            }
            ident.clear();
        };
        for (int32_t i = line_begin[l]; i < line_begin[l + 1]; ++i) {
            for (const char ch : pieces[i]) {
                const unsigned char c = (unsigned char) ch;
                if (c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')) {
                    word += (char) c;
                    ident += (char) c;
                } else if (c >= 'A' && c <= 'Z') {
                    word += (char) (c - 'A' + 'a');
                    ident += (char) (c - 'A' + 'a');
                } else if (c == '_') {
                    end_word();
                    ident += '_';
                } else {
                    end_word();
                    end_ident();
                }
            }
        }
        end_word();
        end_ident();
    };

    // the question's words, each with the lines before the question that hold it (max_lines + 1 once too common)
    const int32_t q_line = (int32_t) (std::upper_bound(line_begin.begin(), line_begin.begin() + n_lines,
            std::max(0, n_tokens - n_question)) - line_begin.begin()) - 1;
    std::unordered_map<std::string, std::vector<int32_t>> lines_of;
    for (int32_t l = q_line; l < n_lines; ++l) {
        for_each_word(l, [&](const std::string & w) { lines_of.emplace(w, std::vector<int32_t>()); });
    }
    for (int32_t l = 0; l < q_line; ++l) {
        for_each_word(l, [&](const std::string & w) {
            auto it = lines_of.find(w);
            if (it != lines_of.end() && (int32_t) it->second.size() <= max_lines &&
                    (it->second.empty() || it->second.back() != l)) {
                it->second.push_back(l);
            }
        });
    }
    for (const auto & [word, lines] : lines_of) {
        if ((int32_t) lines.size() > max_lines) {
            continue;
        }
        for (const int32_t l : lines) {
            std::fill(out.begin() + line_begin[l], out.begin() + line_begin[l + 1], 1);
        }
    }
    return out;
}

std::vector<int32_t> common_spec_prefill_select(
        const float * scores,
        int32_t n_tokens,
        const common_spec_prefill_select_params & params,
        const uint8_t * line_ends,
        const std::string * pieces,
        const uint8_t * protect) {
    std::vector<int32_t> kept;
    if (n_tokens <= 0) {
        return kept;
    }
    const int32_t chunk = std::max(1, params.chunk_size);
    // chunk c is [bounds[c], bounds[c + 1])
    const std::vector<int32_t> bounds = common_spec_prefill_chunks(n_tokens, chunk,
            params.chunk_lines ? line_ends : nullptr);
    const int32_t n_chunks = (int32_t) bounds.size() - 1;

    // the tail always kept: keep_last tokens, at least one chunk (and at least the last token)
    const int32_t n_tail = std::min(n_tokens, std::max({params.keep_last, chunk, 1}));
    const int32_t n_head = std::min(n_tokens, std::max(0, params.keep_first));

    std::vector<char> keep(n_tokens, 0);
    std::fill(keep.begin(), keep.begin() + n_head, 1);
    std::fill(keep.end() - n_tail, keep.end(), 1);
    if (params.question_lines > 0 && line_ends && pieces) {
        const std::vector<uint8_t> asked = common_spec_prefill_question_lines(pieces, line_ends, n_tokens, n_tail,
                params.question_lines);
        for (int32_t i = 0; i < n_tokens; ++i) {
            keep[i] = keep[i] || asked[i];
        }
    }
    // protected spans are added after the selection, which runs as if there were none: the kept set is the
    // unprotected one plus the spans, so a protected prompt never keeps less of its open part than an unprotected one
    auto is_protected = [&](int32_t i) { return protect && protect[i]; };

    auto score_at = [&](int32_t i) {
        const float s = scores[i];
        return std::isfinite(s) ? (double) s : 0.0;
    };

    std::vector<double> chunk_sum(n_chunks, 0.0);
    std::vector<int32_t> candidates;
    for (int32_t c = 0; c < n_chunks; ++c) {
        const int32_t i0 = bounds[c];
        const int32_t i1 = bounds[c + 1];
        bool all_forced = true;
        for (int32_t i = i0; i < i1; ++i) {
            chunk_sum[c] += score_at(i);
            all_forced = all_forced && keep[i];
        }
        if (!all_forced) {
            candidates.push_back(c);
        }
    }
    auto chunk_mean = [&](int32_t c) {
        return chunk_sum[c] / (bounds[c + 1] - bounds[c]);
    };
    // highest mean first; ties go to the earlier chunk, so the result is deterministic
    std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
        return chunk_mean(a) > chunk_mean(b);
    });

    // max_keep counts the protected tokens too: they are kept whatever the selection does
    auto held_at = [&](int32_t i) { return keep[i] || is_protected(i); };
    int32_t n_kept = 0;
    for (int32_t i = 0; i < n_tokens; ++i) {
        n_kept += held_at(i);
    }
    // with max_keep, a chunk that would take the count past it is passed over (a lower one may still fit)
    auto fits = [&](int32_t c) {
        if (params.max_keep <= 0) {
            return true;
        }
        int32_t n_new = 0;
        for (int32_t i = bounds[c]; i < bounds[c + 1]; ++i) {
            n_new += !held_at(i);
        }
        return n_kept + n_new <= params.max_keep;
    };
    auto take = [&](int32_t c) {
        for (int32_t i = bounds[c]; i < bounds[c + 1]; ++i) {
            n_kept += !held_at(i);
            keep[i] = 1;
        }
    };

    if (params.mode == COMMON_SPEC_PREFILL_SELECT_MASS) {
        double total = 0.0;
        double held  = 0.0;
        for (int32_t i = 0; i < n_tokens; ++i) {
            total += score_at(i);
            held  += keep[i] ? score_at(i) : 0.0;
        }
        const double target = params.mass * total;
        for (int32_t c : candidates) {
            if (held >= target) {
                break;
            }
            if (!fits(c)) {
                continue;
            }
            for (int32_t i = bounds[c]; i < bounds[c + 1]; ++i) {
                held += keep[i] ? 0.0 : score_at(i);
            }
            take(c);
        }
    } else {
        // the small epsilon keeps e.g. 0.3 * 10 chunks at 3, not 4; keep is a float, off by up to keep * FLT_EPSILON / 2,
        // so the epsilon grows with the product (0.3f * 100 = 30.0000012 must give 30, not 31)
        const double  x     = (double) params.keep * n_chunks;
        const int32_t n_top = std::max(1, (int32_t) std::ceil(x - std::max(1e-6, x * FLT_EPSILON)));
        int32_t n_taken = 0;
        for (size_t k = 0; k < candidates.size() && n_taken < n_top; ++k) {
            if (fits(candidates[k])) {
                take(candidates[k]);
                n_taken++;
            }
        }
    }

    for (int32_t i = 0; i < n_tokens; ++i) {
        keep[i] = held_at(i);
    }

    if (params.complete_lines && line_ends) {
        std::vector<char> grown = spec_prefill_complete_lines(keep, line_ends, chunk / 2);
        // under max_keep, whole lines only where they all fit
        if (params.max_keep <= 0 || std::count(grown.begin(), grown.end(), 1) <= params.max_keep) {
            keep = std::move(grown);
        }
    }

    for (int32_t i = 0; i < n_tokens; ++i) {
        if (keep[i]) {
            kept.push_back(i);
        }
    }
    return kept;
}
