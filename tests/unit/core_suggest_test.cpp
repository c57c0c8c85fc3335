// "Did you mean" (core/suggest.h): the distance, the closeness limit and the phrase the messages use.
#include <gtest/gtest.h>

#include "core/suggest.h"

namespace dp {
namespace {

TEST(Suggest, DistanceCountsEditsAndNeighbourSwapsOnce) {
  EXPECT_EQ(spelling_distance("steps", "steps"), 0);
  EXPECT_EQ(spelling_distance("stpes", "steps"), 1);   // two neighbours swapped
  EXPECT_EQ(spelling_distance("step", "steps"), 1);    // one missing
  EXPECT_EQ(spelling_distance("stepz", "steps"), 1);   // one wrong
  EXPECT_EQ(spelling_distance("device_map", "device-map"), 0);
  EXPECT_EQ(spelling_distance("Device-Map", "device-map"), 0);
  EXPECT_EQ(spelling_distance("", "abc"), 3);
  EXPECT_EQ(spelling_distance("kitten", "sitting"), 3);
}

TEST(Suggest, OffersOnlyCloseNames) {
  const std::vector<std::string> keys = {"steps", "seed", "height", "width", "device-map", "max-memory",
                                         "num-images-per-prompt", "out"};
  EXPECT_EQ(closest_spelling("stpes", keys), "steps");
  EXPECT_EQ(closest_spelling("hieght", keys), "height");
  EXPECT_EQ(closest_spelling("device_map", keys), "device-map");
  EXPECT_EQ(closest_spelling("--max_memroy", keys), "max-memory");
  EXPECT_EQ(closest_spelling("num-image-per-promt", keys), "num-images-per-prompt");
  EXPECT_EQ(closest_spelling("colour", keys), "");  // nothing near
  EXPECT_EQ(closest_spelling("xyz", keys), "");
  EXPECT_EQ(closest_spelling("", keys), "");
  EXPECT_EQ(did_you_mean("sed", keys), " (did you mean 'seed'?)");
  EXPECT_EQ(did_you_mean("resolution", keys), "");
}

}  // namespace
}  // namespace dp
