package org.cellm;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.InputStream;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

/**
 * Tests of the Java binding against the real default model (SmolLM2-135M), run on the
 * desktop JVM by scripts/test.sh:
 *
 * <pre>
 * java -Dcellm.jni.library=build/libcellm_jni.so -cp build/cellm.jar:build/cellm-test.jar \
 *     org.cellm.CellmTest
 * </pre>
 *
 * Each public static void test* method is one test; a failed check throws. Expected texts
 * come from the cellm command ($CELLM_BIN, else build/cellm) run on the same prompt at test
 * time, with greedy decoding. The model is $CELLM_TEST_SMOLLM2, else smollm2-135m.gguf in
 * the store (${CELLM_HOME:-$HOME/.cache/cellm}/models). It ends with "N passed, M failed" and
 * exits 1 if any failed. No JUnit: nothing is fetched.
 */
public final class CellmTest {
    static final String PROMPT = "The three primary colors are";
    // Greedy SmolLM2 goes on after this until the context is full.
    static final String LONG_PROMPT = "Count from one to one thousand: one, two, three,";
    static final String QUESTION = "What is the capital of France?";

    static Model model;
    static Engine engine;

    static void check(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    static void checkEquals(Object want, Object got, String what) {
        if (want == null ? got != null : !want.equals(got))
            throw new AssertionError(what + ": want <" + want + "> got <" + got + ">");
    }

    interface Body {
        void run() throws Exception;
    }

    /** Runs body, which must throw CellmException with the status; returns it. */
    static CellmException expectCellm(int status, Body body) throws Exception {
        try {
            body.run();
        } catch (CellmException e) {
            checkEquals(status, e.status(), "status of \"" + e.getMessage() + "\"");
            return e;
        }
        throw new AssertionError("no CellmException");
    }

    static String modelPath() {
        String p = System.getenv("CELLM_TEST_SMOLLM2");
        if (p == null || p.isEmpty()) {
            // The store's rule, as the cellm command and the C tests have it:
            // $CELLM_HOME, else $HOME/.cache/cellm. Java's user.home comes from
            // the password database, not $HOME, and differs from it under
            // sudo, in containers and for service accounts.
            String home = System.getenv("CELLM_HOME");
            if (home == null || home.isEmpty()) {
                String h = System.getenv("HOME");
                check(h != null && !h.isEmpty(),
                        "neither CELLM_HOME nor HOME is set: cannot find the model store");
                home = h + "/.cache/cellm";
            }
            p = home + "/models/smollm2-135m.gguf";
        }
        check(new File(p).isFile(), "real model not found at " + p
                + ": run `cellm pull smollm2-135m`");
        return p;
    }

    /** What `cellm run MODEL ARGS` prints, less its final newline. */
    static String cliRun(String... args) throws Exception {
        String bin = System.getenv("CELLM_BIN");
        if (bin == null || bin.isEmpty()) bin = "build/cellm";
        check(new File(bin).canExecute(), "the cellm command is not at " + bin
                + ": build it or set CELLM_BIN");
        List<String> cmd = new ArrayList<>(List.of(bin, "run", modelPath()));
        Collections.addAll(cmd, args);
        Process p = new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.DISCARD)
                .start();
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (InputStream in = p.getInputStream()) {
            in.transferTo(out);
        }
        check(p.waitFor(300, TimeUnit.SECONDS), "cellm run timed out");
        checkEquals(0, p.exitValue(), "exit status of cellm run");
        String s = out.toString(StandardCharsets.UTF_8);
        check(s.endsWith("\n"), "cellm run output ends with a newline");
        return s.substring(0, s.length() - 1);
    }

    /** Collects what a listener receives, and on which threads. */
    static final class Collector implements TokenListener {
        final List<String> pieces = Collections.synchronizedList(new ArrayList<>());
        final AtomicReference<Thread> thread = new AtomicReference<>();
        final AtomicInteger completions = new AtomicInteger();
        volatile Result completed;

        @Override
        public void onToken(String piece) {
            pieces.add(piece);
            thread.set(Thread.currentThread());
        }

        @Override
        public void onComplete(Result r) {
            completed = r;
            completions.incrementAndGet();
        }

        String joined() {
            synchronized (pieces) {
                return String.join("", pieces);
            }
        }
    }

    // ---------------------------------------------------------------- errors

    public static void testMissingModelIsAnException() throws Exception {
        String path = "/nonexistent/dir/model.gguf";
        CellmException e = expectCellm(CellmException.IO, () -> new Model(path));
        check(e.getMessage().contains(path), "the message names the file: " + e.getMessage());
    }

    public static void testNotAModelIsAnException() throws Exception {
        Path f = Files.createTempFile("cellm-test", ".gguf");
        try {
            Files.write(f, "this is not a GGUF file at all".repeat(10).getBytes());
            CellmException e = expectCellm(CellmException.FORMAT, () -> new Model(f.toString()));
            check(!e.getMessage().isEmpty(), "a message");
        } finally {
            Files.delete(f);
        }
    }

    public static void testBadArgumentsAreExceptions() throws Exception {
        expectCellm(CellmException.INVALID_ARG, () -> new Model("model\0.gguf"));
        expectCellm(CellmException.INVALID_ARG, () -> new Model(null));
        expectCellm(CellmException.INVALID_ARG, () -> new Model(modelPath(), "no-such-format"));
        expectCellm(CellmException.INVALID_ARG,
                () -> new Engine(model, new Engine.Options().threads(-3)));
        expectCellm(CellmException.INVALID_ARG,
                () -> engine.generate("", new GenerationOptions(), null));
        expectCellm(CellmException.INVALID_ARG, () -> engine.generate("Hi",
                new GenerationOptions().temperature(Float.NaN), null));
        String[] many = new String[17];
        java.util.Arrays.fill(many, "x");
        expectCellm(CellmException.INVALID_ARG,
                () -> engine.generate("Hi", new GenerationOptions().stop(many), null));
        expectCellm(CellmException.INVALID_ARG,
                () -> engine.chat(List.of(new ChatMessage("user", "a\0b")), null, null));
    }

    // ------------------------------------------------------------ generation

    public static void testStreamingMatchesTheCommand() throws Exception {
        String want = cliRun("--raw", "-p", PROMPT, "-n", "24");
        Collector c = new Collector();
        Generation g = engine.generate(PROMPT, new GenerationOptions().maxTokens(24), c);
        Result r = g.await();
        checkEquals(want, r.text(), "text");
        check(!want.isBlank(), "some text");
        check(c.pieces.size() > 1, "streamed in pieces: " + c.pieces.size());
        checkEquals(want, c.joined(), "the pieces joined");
        check(c.thread.get() != Thread.currentThread(), "pieces come on the engine thread");
        checkEquals(1, c.completions.get(), "onComplete calls");
        checkEquals(r.text(), c.completed.text(), "onComplete's text");
        check(r.finishReason() == FinishReason.LENGTH || r.finishReason() == FinishReason.STOP,
                "finish " + r.finishReason());
        check(r.promptTokens() > 0, "prompt tokens");
        checkEquals(r, g.await(), "await() again");
        g.close();
        g.close();
    }

    public static void testUnicodeMatchesTheCommand() throws Exception {
        // Emoji and CJK: UTF-8 both ways (not JNI's "modified UTF-8").
        String prompt = "Emoji 😀🎉 and 日本語 text:";
        String want = cliRun("--raw", "-p", prompt, "-n", "16");
        Result r = engine.generate(prompt, new GenerationOptions().maxTokens(16), null).await();
        checkEquals(want, r.text(), "text");
    }

    public static void testChatMatchesTheCommand() throws Exception {
        String want = cliRun("-p", QUESTION, "-n", "32", "--temp", "0"); // the engine: greedy
        Collector c = new Collector();
        Result r = engine.chat(List.of(ChatMessage.user(QUESTION)),
                new GenerationOptions().maxTokens(32), c).await();
        checkEquals(want, r.text(), "reply");
        checkEquals(want, c.joined(), "streamed reply");
    }

    public static void testStopString() throws Exception {
        String full = engine.generate(PROMPT, new GenerationOptions().maxTokens(24), null)
                .await().text();
        String mid = full.substring(full.length() / 2, full.length() / 2 + 3);
        Result r = engine.generate(PROMPT, new GenerationOptions().maxTokens(24).stop(mid), null)
                .await();
        checkEquals(full.substring(0, full.indexOf(mid)), r.text(), "text before the stop");
        checkEquals(FinishReason.STOP, r.finishReason(), "finish");
    }

    public static void testCancelFromAnotherThread() throws Exception {
        CountDownLatch first = new CountDownLatch(1);
        AtomicInteger pieces = new AtomicInteger();
        Generation g = engine.generate(LONG_PROMPT, new GenerationOptions().maxTokens(-1),
                piece -> {
                    pieces.incrementAndGet();
                    first.countDown();
                });
        Thread canceller = new Thread(() -> {
            try {
                first.await(60, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            g.cancel();
        });
        canceller.start();
        Result r = g.await();
        canceller.join();
        checkEquals(FinishReason.CANCELLED, r.finishReason(), "finish");
        check(pieces.get() >= 1, "it streamed before the cancel");
        check(r.completionTokens() < 1000, "stopped early: " + r.completionTokens());
        g.cancel(); // after the end: harmless
        check(!engine.generate("Hello", new GenerationOptions().maxTokens(4), null).await()
                .text().isEmpty(), "the engine serves on");
    }

    public static void testListenerExceptionCancels() throws Exception {
        RuntimeException boom = new RuntimeException("listener failure");
        AtomicInteger calls = new AtomicInteger();
        Generation g = engine.generate(LONG_PROMPT, new GenerationOptions().maxTokens(-1),
                piece -> {
                    if (calls.incrementAndGet() == 3) throw boom;
                });
        try {
            g.await();
            throw new AssertionError("await() did not throw");
        } catch (CellmException e) {
            check(e.getCause() == boom, "the listener's exception is the cause");
        }
        checkEquals(3, calls.get(), "no pieces to the listener after the exception");
        // The generation was cancelled: at most a piece or two more were made.
        check(g.text().length() < 100, "cancelled after the exception: " + g.text().length());
        check(!engine.generate("Hello", new GenerationOptions().maxTokens(4), null).await()
                .text().isEmpty(), "the engine serves on");
    }

    public static void testWaitingCallsRefusedInListener() throws Exception {
        AtomicReference<Generation> self = new AtomicReference<>();
        List<Integer> statuses = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch attached = new CountDownLatch(1);
        Generation g = engine.generate(PROMPT, new GenerationOptions().maxTokens(8), piece -> {
            try {
                attached.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            for (Runnable call : List.<Runnable>of(() -> self.get().await(),
                    () -> self.get().close(), () -> engine.close(), () -> model.close())) {
                try {
                    call.run();
                    statuses.add(0);
                } catch (CellmException e) {
                    statuses.add(e.status());
                }
            }
        });
        self.set(g);
        attached.countDown();
        Result r = g.await();
        check(!statuses.isEmpty(), "the listener ran");
        for (int s : statuses) checkEquals(CellmException.INVALID_ARG, s, "refused");
        check(r.finishReason() == FinishReason.LENGTH || r.finishReason() == FinishReason.STOP,
                "finished normally: " + r.finishReason());
        checkEquals(r.text(), engine.generate(PROMPT, new GenerationOptions().maxTokens(8), null)
                .await().text(), "same text as without the calls");
    }

    public static void testConcurrentGenerationsFromThreads() throws Exception {
        String[] prompts = {"Once upon a time", "The best way to learn is", "Water boils at"};
        String[] alone = new String[prompts.length];
        for (int i = 0; i < prompts.length; i++)
            alone[i] = engine.generate(prompts[i], new GenerationOptions().maxTokens(16), null)
                    .await().text();
        String[] got = new String[prompts.length];
        Thread[] threads = new Thread[prompts.length];
        for (int i = 0; i < prompts.length; i++) {
            int k = i;
            threads[i] = new Thread(() -> got[k] = engine.generate(prompts[k],
                    new GenerationOptions().maxTokens(16), null).await().text());
            threads[i].start();
        }
        for (Thread t : threads) t.join();
        for (int i = 0; i < prompts.length; i++)
            checkEquals(alone[i], got[i], "batched text of " + prompts[i]);
    }

    public static void testChatSessionKeepsItsCache() throws Exception {
        try (ChatSession chat = engine.newSession(null, new GenerationOptions().maxTokens(32))) {
            Collector c = new Collector();
            Result first = chat.send(QUESTION, c).await();
            checkEquals(engine.chat(List.of(ChatMessage.user(QUESTION)),
                    new GenerationOptions().maxTokens(32), null).await().text(), first.text(),
                    "first turn as a one-off chat");
            checkEquals(first.text(), c.joined(), "streamed");
            Result second = chat.send("And of Italy?", null).await();
            check(!second.text().isEmpty(), "a second reply");
            check(second.cachedTokens() > 0, "the second turn reused the first's KV cache");
            List<ChatMessage> msgs = chat.messages();
            checkEquals(4, msgs.size(), "messages");
            checkEquals("assistant", msgs.get(1).role(), "role");
            checkEquals(first.text(), msgs.get(1).content(), "the first reply in the history");
            // Memory pressure: the kept KV cache goes, the conversation goes on.
            check(engine.trim(Engine.TRIM_MODERATE) >= 0, "trim");
            Result third = chat.send("Thanks!", null).await();
            checkEquals(0, third.cachedTokens(), "nothing kept after the trim");
            check(!third.text().isEmpty(), "a third reply");
            expectCellm(CellmException.INVALID_ARG, () -> engine.trim(9));
        }
    }

    // ------------------------------------------------------------- lifetimes

    public static void testCloseTwiceAndOutOfOrder() throws Exception {
        Model m = new Model(modelPath());
        Engine e = new Engine(m, new Engine.Options().threads(1).maxContext(512));
        CountDownLatch first = new CountDownLatch(1);
        Generation g = e.generate(LONG_PROMPT, new GenerationOptions().maxTokens(-1),
                piece -> first.countDown());
        ChatSession s = e.newSession("Be brief.", null);
        check(first.await(60, TimeUnit.SECONDS), "it streamed");
        m.close(); // closes the engine, its generation and its session first
        m.close();
        e.close();
        g.close();
        s.close();
        checkEquals(FinishReason.CANCELLED, g.await().finishReason(), "closed while running");
        expectCellm(CellmException.INVALID_ARG,
                () -> e.generate("Hello", new GenerationOptions(), null));
        expectCellm(CellmException.INVALID_ARG, () -> s.send("Hello", null));
        expectCellm(CellmException.INVALID_ARG, () -> new Engine(m));
        // Closing a generation that was never awaited, then awaiting it.
        Generation h = engine.generate(LONG_PROMPT, new GenerationOptions().maxTokens(-1), null);
        h.close();
        h.close();
        checkEquals(FinishReason.CANCELLED, h.await().finishReason(), "closed, then awaited");
    }

    public static void testCloseWhileThreadsSubmit() throws Exception {
        Model m = new Model(modelPath());
        Engine e = new Engine(m, new Engine.Options().threads(1).maxContext(256));
        CountDownLatch started = new CountDownLatch(1);
        List<String> ends = Collections.synchronizedList(new ArrayList<>());
        List<Generation> made = Collections.synchronizedList(new ArrayList<>());
        Thread[] threads = new Thread[2];
        for (int i = 0; i < threads.length; i++) {
            threads[i] = new Thread(() -> {
                try {
                    while (true) {
                        if (made.size() < 64) { // a bound on what the close cancels
                            made.add(e.generate("Hello", new GenerationOptions().maxTokens(8),
                                    null));
                        } else {
                            e.trim(Engine.TRIM_LIGHT); // or refused once closed
                        }
                        started.countDown();
                    }
                } catch (CellmException x) {
                    ends.add(x.getMessage());
                }
            });
            threads[i].start();
        }
        check(started.await(60, TimeUnit.SECONDS), "generations started");
        Thread.sleep(200);
        e.close(); // while the threads submit: each either made it or is refused
        for (Thread t : threads) {
            t.join(60000);
            check(!t.isAlive(), "a submitting thread ended");
        }
        checkEquals(List.of("the engine is closed", "the engine is closed"), ends, "refusals");
        synchronized (made) {
            check(!made.isEmpty(), "some were made");
            for (Generation g : made)
                check(g.await().finishReason() != FinishReason.NONE, "each finished");
        }
        m.close();
    }

    // ------------------------------------------------------------------ runner

    public static void main(String[] args) throws Exception {
        System.out.println("cellm " + Model.version());
        model = new Model(modelPath());
        engine = new Engine(model, new Engine.Options().threads(2).maxContext(1024));
        int passed = 0, failed = 0;
        Method[] methods = CellmTest.class.getDeclaredMethods();
        java.util.Arrays.sort(methods, java.util.Comparator.comparing(Method::getName));
        for (Method m : methods) {
            if (!m.getName().startsWith("test") || !Modifier.isPublic(m.getModifiers()))
                continue;
            long t0 = System.nanoTime();
            try {
                m.invoke(null);
                passed++;
                System.out.printf("ok   %s (%.1f s)%n", m.getName(), (System.nanoTime() - t0) / 1e9);
            } catch (java.lang.reflect.InvocationTargetException e) {
                failed++;
                System.out.println("FAIL " + m.getName() + ": " + e.getCause());
                e.getCause().printStackTrace(System.out);
            }
        }
        engine.close();
        model.close();
        // Every native request (and the global reference it holds) was freed.
        long live = Native.liveRequests();
        if (live == 0) {
            passed++;
            System.out.println("ok   noNativeRequestLeft");
        } else {
            failed++;
            System.out.println("FAIL noNativeRequestLeft: " + live + " still allocated");
        }
        System.out.println(passed + " passed, " + failed + " failed");
        System.exit(failed == 0 ? 0 : 1);
    }
}
