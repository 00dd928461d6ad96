package org.cellm;

/** One message of a conversation: role "system", "user" or "assistant", and its text. */
public final class ChatMessage {
    private final String role, content;

    public ChatMessage(String role, String content) {
        this.role = role;
        this.content = content;
    }

    public static ChatMessage system(String content) {
        return new ChatMessage("system", content);
    }

    public static ChatMessage user(String content) {
        return new ChatMessage("user", content);
    }

    public static ChatMessage assistant(String content) {
        return new ChatMessage("assistant", content);
    }

    public String role() {
        return role;
    }

    public String content() {
        return content;
    }

    @Override
    public String toString() {
        return role + ": " + content;
    }
}
