package org.cellm.examples;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executor;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicReference;
import org.cellm.ChatSession;
import org.cellm.Engine;
import org.cellm.Generation;
import org.cellm.GenerationOptions;
import org.cellm.Model;
import org.cellm.Result;
import org.cellm.TokenListener;

/**
 * A chat that streams its replies to a UI thread: the shape an Android app gives cellm (a
 * ViewModel owns it; {@code ui} is the main thread's executor, e.g.
 * {@code ContextCompat.getMainExecutor(context)}). Pieces arrive on the engine thread and
 * are posted to {@code ui}; a Stop button calls {@link #stop()}. It uses only the public
 * org.cellm API and plain Java, so the build compiles it on the desktop, and its main()
 * runs it there:
 *
 * <pre>
 * java -Dcellm.jni.library=build/libcellm_jni.so \
 *     -cp build/cellm.jar:build/cellm-examples.jar org.cellm.examples.StreamingChat \
 *     MODEL.gguf "What is the capital of France?" "And of Italy?"
 * </pre>
 */
public final class StreamingChat implements AutoCloseable {
    /** What the UI shows; called on the {@code ui} executor. */
    public interface View {
        void append(String text);

        void finished(Result result);
    }

    private final Model model;
    private final Engine engine;
    private final ChatSession session;
    private final Executor ui;
    private Generation current; // touched on the UI thread only

    public StreamingChat(String modelPath, Executor ui) {
        this.ui = ui;
        model = new Model(modelPath); // a CellmException names a missing or bad file
        engine = new Engine(model, new Engine.Options().memoryBudgetBytes(128L << 20));
        session = engine.newSession("You are a helpful assistant. Answer briefly.",
                new GenerationOptions().maxTokens(128));
    }

    /** Sends a message (on the UI thread); the reply streams into {@code view}. */
    public void send(String message, View view) {
        if (current != null) current.close(); // frees the previous turn (cancels it if running)
        current = session.send(message, new TokenListener() {
            @Override
            public void onToken(String piece) { // the engine thread: hand over, return
                ui.execute(() -> view.append(piece));
            }

            @Override
            public void onComplete(Result result) {
                ui.execute(() -> view.finished(result));
            }
        });
    }

    /** Stops the reply being written (any thread). */
    public void stop() {
        Generation g = current;
        if (g != null) g.cancel();
    }

    @Override
    public void close() { // the ViewModel's onCleared()
        model.close(); // closes the session, engine and generations too
    }

    /** The desktop run: each argument after the model is one turn. */
    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: StreamingChat MODEL.gguf MESSAGE...");
            System.exit(2);
        }
        ExecutorService ui = Executors.newSingleThreadExecutor();
        int empty = 0;
        try (StreamingChat chat = new StreamingChat(args[0], ui)) {
            for (int i = 1; i < args.length; i++) {
                CountDownLatch done = new CountDownLatch(1);
                AtomicReference<Result> result = new AtomicReference<>();
                String message = args[i];
                System.out.println("> " + message);
                ui.execute(() -> chat.send(message, new View() {
                    @Override
                    public void append(String text) {
                        System.out.print(text);
                        System.out.flush();
                    }

                    @Override
                    public void finished(Result r) {
                        result.set(r);
                        done.countDown();
                    }
                }));
                done.await();
                System.out.println("\n(" + result.get() + ")");
                if (result.get().text().isEmpty()) empty++;
            }
        } finally {
            ui.shutdown();
        }
        System.exit(empty == 0 ? 0 : 1);
    }
}
