#pragma once
// What a harness decided about the input it was just given. libFuzzer only wants a return value of 0, so the
// decision travels beside it: the corpus replayer (replay_main.cpp) clears it before each input and checks it
// against the file's name afterwards, since make_corpus.py names every seed for the outcome it was written to
// provoke: bad_* must be rejected, valid_* and quirk_* accepted. Under libFuzzer nobody reads it.
namespace dp::fuzz {

enum class Verdict { none, accepted, rejected };

inline Verdict& last_verdict() {
  static Verdict verdict = Verdict::none;
  return verdict;
}
inline void note_accepted() { last_verdict() = Verdict::accepted; }
inline void note_rejected() { last_verdict() = Verdict::rejected; }

}  // namespace dp::fuzz
