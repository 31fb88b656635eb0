"""The salted digests of the quizzes' right answers (``gpulab.quiz``): what the quiz's self-check compares a
learner's answer with in self-study. ``python -m autograder.quizzes`` prints them from the grader's answer key after
a change; ``tests/test_quiz.py`` holds them to it."""

DIGESTS = {
    "01_splitting": {
        "q1": (
            "7c47b24782adb8755096f36192118ccc",
            "4214aaedeb846999f08fb1e8446bbee0872c1bc557a3bcbff36606fde31c4468",
        ),
        "q2": (
            "552080ce05beea1e8813cbc25ae68e08",
            "ad7118a9a7e2146cc0ce13c8b85d0baaf6d8a1f6256c612de4894960f4fdf270",
        ),
        "q3": (
            "40155d6b95993ceda6203700d3d828c6",
            "63ceb8ada63e19067f2f04ec96eba33d486abf3817aa9cf3eb8197052cbb9f62",
        ),
    },
    "02_gradient_averaging": {
        "q1": (
            "748e228f4e778b94260218f1c301a1e7",
            "16397e1aae54b8c4ccd2c294837588c98add45163b5962485ff5c7d4ed1d83cf",
        ),
        "q2": (
            "0cf82701d37e903dc9f6d77eacba7fd0",
            "23ff05ec98420d6346c6e2c8ef52244562407d14700a89ab14a1715f6019340b",
        ),
        "q3": (
            "85a526cb0237e0027794c6ea52d932d3",
            "718aafd582908c4b9f22e9eabb46b58f2ba8f24048425135dc23483deb0167bb",
        ),
        "q4": (
            "f29babba4377294ffed606f0d28958bc",
            "cca2d578b274d820ccfd22a95c5f00832396d5902306e0526f406a9ac41a68b0",
        ),
    },
    "03_gpu0_imbalance": {
        "q1": (
            "d76cf5206eb664e82a22b53e981d6f3b",
            "ef59e5480c8ce745484b6116a0eab723eb6a4ff0682af2fad9b23044992d6a39",
        ),
        "q2": (
            "6b0784a70605300712a0138d8fb0d0fb",
            "a5978348b6d322c5b89fe52828c20933e54ba9427689e435b1280bd86609d686",
        ),
        "q3": (
            "2064bfb432d9ff30f0a1e6e57770bca9",
            "2ae8d6674ce116e5d5c66ebc8d96e8e937f7841a418a70713ec2809ab2c13748",
        ),
        "q4": (
            "d6f158f648c98d0334989155cf3fa6ca",
            "a3a633aba2ea6bb5dbb80d7e220fd5118c3754f065a42a171c2114cccba8063f",
        ),
        "q5": (
            "e05c448486f572e06dbcbb64c1c3d013",
            "2d055587d6515e5396e5fdaa2f1c84b35a48a337ed7573a8a892358d48d69f14",
        ),
    },
    "04_checkpoints": {
        "q1": (
            "33f9d180279861ca3fc252ba1b9ed4b7",
            "05550e2c2b69e9f92da2d78def270d0c33b2a206919e65cd04c91dad84f80140",
        ),
        "q2": (
            "5b3220bf5c7633cf8b2730aeb01c0194",
            "809fe9caab1759f31517ad055466d71be11c9f71c1a50518406f0e411616bc31",
        ),
        "q3": (
            "8c1db0a13999d55ee5c28b3f8527c538",
            "dc8f4fb57c1739f6ec2001fc9c11c0727ff9ab26a85a4e3227ef2da0e37b06ac",
        ),
        "q4": (
            "438e28ba39e289b8634da6f81bbb8a89",
            "34ab49a20206752d30e080e906a51c8c192c6aee8366e99c7bedfe0cf98def70",
        ),
    },
}
